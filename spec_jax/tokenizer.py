"""Tokenizer: a thin wrapper over `tokenizers.Tokenizer` with special ids and a chat template.

Built from a GGUF file's metadata (`Tokenizer.from_gguf_fields`, byte-level BPE from the
vocab and merges) or from a Hugging Face directory (`Tokenizer.from_dir`: tokenizer.json +
tokenizer_config.json, and chat_template.jinja when present). Chat templates are rendered
with jinja2 in a sandbox, with the helpers Hugging Face provides (`raise_exception`,
`strftime_now`, a non-escaping `tojson`).

    tok = Tokenizer.from_dir('/path/to/hf_model')
    ids = tok.encode_chat([{'role': 'user', 'content': 'Hi'}])
    text = tok.decode(ids, skip_special=True)
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

# End-of-turn / end-of-text tokens that stop generation whenever they are special tokens of
# the vocabulary (SmolLM2/Qwen: <|im_end|>, <|endoftext|>; Llama 3: <|eot_id|>, ...).
STOP_TOKEN_NAMES = (
    '<|endoftext|>',
    '<|im_end|>',
    '<|eot_id|>',
    '<|eom_id|>',
    '<|end_of_text|>',
    '</s>',
)

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the split regex it applies before
# byte-level BPE. 'smollm' is special-cased: individual digits, then the GPT-2 pattern.
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r'|\s*[\r\n]+|\s+(?!\S)|\s+'
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r'|\s*[\r\n]+|\s+(?!\S)|\s+'
)
_GGUF_PRE_REGEX = {
    'llama-bpe': _LLAMA3_REGEX,
    'llama3': _LLAMA3_REGEX,
    'qwen2': _QWEN2_REGEX,
    'qwen35': _QWEN2_REGEX,
}
_GGUF_CONTROL = 3  # llama.cpp token type of control (special) tokens.
_GGUF_USER_DEFINED = 4


class TokenizerError(ValueError):
    """A tokenizer could not be built or does not fit its model."""


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or {'content': ...} dicts."""
    if isinstance(value, Mapping):
        return value.get('content')
    return value


@functools.lru_cache(maxsize=32)
def _compile_template(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters['tojson'] = tojson
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = strftime_now
    return env.from_string(source)


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special ids and chat template a decoder needs.

    Attributes:
      backend: the wrapped `tokenizers.Tokenizer`.
      chat_template: jinja2 source of the chat template, or None.
      bos_id, eos_id, pad_id: special ids (None when the tokenizer has none).
      stop_ids: ids that end generation: eos plus every STOP_TOKEN_NAMES special token.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        chat_template: str | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        extra_stop_ids: Iterable[int] = (),
    ):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        stops = [] if eos_id is None else [eos_id]
        stops += list(extra_stop_ids)
        for name in STOP_TOKEN_NAMES:
            i = backend.token_to_id(name)
            if i is not None and name in special:
                stops.append(i)
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(stops))

    # ---- properties -----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_id is None else self.backend.id_to_token(self.bos_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_id is None else self.backend.id_to_token(self.eos_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    # ---- encode / decode ------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text always map to their ids.

        Args:
          text: the text.
          add_special: apply the post-processor (e.g. prepend BOS where the model wants it).
        """
        return self.backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`; `skip_special` drops special tokens."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Renders `messages` ([{'role': ..., 'content': ...}]) with the chat template.

        Args:
          messages: the conversation.
          add_generation_prompt: end with the assistant header, ready for generation.
          **kwargs: further template variables (e.g. tools, enable_thinking).

        Returns:
          The prompt text (special tokens as text; encode it with add_special=False).
        """
        if not self.chat_template:
            raise TokenizerError('this tokenizer has no chat template')
        template = _compile_template(self.chat_template)
        variables = dict(bos_token=self.bos_token or '', eos_token=self.eos_token or '')
        variables.update(kwargs)
        return template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **variables
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs
    ) -> list[int]:
        """Token ids of the rendered chat (the template writes any BOS itself)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))

    # ---- checks and persistence -----------------------------------------------------------

    def check_fits(self, model_vocab_size: int) -> None:
        """Raises TokenizerError when some token id would fall outside the model's embedding.

        A smaller tokenizer is fine: models pad their embeddings (Qwen: 151665 vs 151936).
        """
        if self.vocab_size > model_vocab_size:
            raise TokenizerError(
                f'tokenizer vocab size {self.vocab_size} is larger than the model vocab size '
                f'{model_vocab_size}: this tokenizer does not belong to this model'
            )

    def save(self, directory: str | os.PathLike) -> None:
        """Writes tokenizer.json and tokenizer_config.json (readable by `from_dir`)."""
        os.makedirs(directory, exist_ok=True)
        self.backend.save(os.path.join(directory, 'tokenizer.json'))
        config = {
            'bos_token': self.bos_token,
            'eos_token': self.eos_token,
            'pad_token': None if self.pad_id is None else self.backend.id_to_token(self.pad_id),
            'chat_template': self.chat_template,
            'spec_jax_stop_ids': list(self.stop_ids),
        }
        with open(os.path.join(directory, 'tokenizer_config.json'), 'w') as f:
            json.dump(config, f, indent=2, ensure_ascii=False)

    # ---- constructors ---------------------------------------------------------------------

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> Tokenizer:
        """Builds the tokenizer of a Hugging Face model directory.

        Reads tokenizer.json (required), tokenizer_config.json (special tokens, chat template),
        chat_template.jinja (preferred template when present) and generation_config.json
        (extra eos ids).
        """
        directory = os.fspath(directory)
        path = os.path.join(directory, 'tokenizer.json')
        if not os.path.isfile(path):
            raise TokenizerError(f'no tokenizer.json in {directory}')
        try:
            backend = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON.
            raise TokenizerError(f'cannot read tokenizer {path}: {e}') from e
        config = _read_json(os.path.join(directory, 'tokenizer_config.json')) or {}
        template = config.get('chat_template')
        if isinstance(template, list):  # [{'name': 'default', 'template': ...}, ...]
            named = {t.get('name'): t.get('template') for t in template}
            template = named.get('default') or next(iter(named.values()), None)
        jinja_path = os.path.join(directory, 'chat_template.jinja')
        if os.path.isfile(jinja_path):
            with open(jinja_path) as f:
                template = f.read()

        def special_id(key):
            text = _token_text(config.get(key))
            return None if text is None else backend.token_to_id(text)

        extra = list(config.get('spec_jax_stop_ids') or [])
        gen = _read_json(os.path.join(directory, 'generation_config.json')) or {}
        gen_eos = gen.get('eos_token_id')
        extra += gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
        return cls(
            backend,
            chat_template=template,
            bos_id=special_id('bos_token'),
            eos_id=special_id('eos_token'),
            pad_id=special_id('pad_token'),
            extra_stop_ids=extra,
        )

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """Builds the tokenizer described by GGUF metadata (`tokenizer.ggml.*`).

        Args:
          fields: GGUF metadata as plain Python values (key -> str/int/list).

        Supports byte-level BPE (`tokenizer.ggml.model == 'gpt2'`) with the pre-tokenizers
        'smollm' (digits split one by one, then GPT-2's regex), 'llama-bpe' and 'qwen2';
        other pre-tokenizer names fall back to GPT-2's regex.
        """
        kind = fields.get('tokenizer.ggml.model')
        if kind != 'gpt2':
            raise TokenizerError(
                f'GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, "gpt2")'
            )
        tokens = list(fields['tokenizer.ggml.tokens'])
        merges = [tuple(m.split(' ', 1)) for m in fields.get('tokenizer.ggml.merges', [])]
        types = list(fields.get('tokenizer.ggml.token_type', [1] * len(tokens)))
        vocab = {t: i for i, t in enumerate(tokens)}
        backend = tokenizers.Tokenizer(
            models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
        )
        pre = fields.get('tokenizer.ggml.pre', 'default')
        if pre == 'smollm':
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                ]
            )
        elif pre in _GGUF_PRE_REGEX:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(
                        tokenizers.Regex(_GGUF_PRE_REGEX[pre]), behavior='isolated'
                    ),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        # Control tokens are special (skipped by decode(skip_special=True)); user-defined ones
        # (e.g. Qwen's <think>) are matched whole in text but decoded like ordinary tokens.
        backend.add_special_tokens(
            [
                tokenizers.AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types)
                if t == _GGUF_CONTROL
            ]
        )
        backend.add_tokens(
            [
                tokenizers.AddedToken(tokens[i], special=False, normalized=False)
                for i, t in enumerate(types)
                if t == _GGUF_USER_DEFINED
            ]
        )

        def get_id(key):
            value = fields.get(f'tokenizer.ggml.{key}_token_id')
            return None if value is None else int(value)

        bos_id = get_id('bos')
        if fields.get('tokenizer.ggml.add_bos_token') and bos_id is not None:
            bos = tokens[bos_id]
            backend.post_processor = processors.TemplateProcessing(
                single=f'{bos} $A', pair=f'{bos} $A {bos} $B', special_tokens=[(bos, bos_id)]
            )
        return cls(
            backend,
            chat_template=fields.get('tokenizer.chat_template'),
            bos_id=bos_id,
            eos_id=get_id('eos'),
            pad_id=get_id('padding'),
            extra_stop_ids=[i for i in [get_id('eot'), get_id('eom')] if i is not None],
        )


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f'cannot read {path}: {e}') from e
