"""INCLUDE (include-base-44): regional-knowledge multiple-choice exams in 44 languages.

The task is a frozen dataclass (`INCLUDE`; `TASKS` maps 'include' to it) with fields `root`,
the data root a config names with `data_root` ('' = $SPEC_JAX_DATA, else the samples bundled
in the package, which hold no INCLUDE data: the
paper's 220 are source 'fast_hsd'), `seed`, the run's seed for the random guess,
`languages` (only these; () = all), `split` (the hub split), `per_language` and `sample_seed`
(a seeded sample of that many questions per language; 0 = all) and `system_prompt`.

Data. Rows in the hub's schema: language, country, domain, subject, regional_feature, level,
question, option_a..option_d and answer (0-3, the index of the right option). `load('')`
reads `include/test.jsonl` under the data root (nothing is bundled: without it, a
`DataFileError` names that file, the `data_root` field and the hub id); `load(path)` reads a
local .jsonl, .json or .parquet file in that schema, or a directory holding
`include/test.jsonl` or `test.jsonl`; `load('hub')` reads `CohereLabs/include-base-44`
through `datasets`, one config per language (`languages`, else every config the hub lists).
Item ids are '<language>/<row of that language>'. `load('fast_hsd')` reads the paper's
exact 220 (5 per language, 44 languages; `tasks.fast_hsd`, bundled: the offline sample),
parsed back from Fast-HSD's prompts into this schema (subject = its category; country,
domain, regional feature and level are not in the file), ids 'fast_hsd/<question_id>', in
the file's order; `languages` still filters, and `per_language` must be 0 (no resampling of
the paper's selection). `per_language=5` on another source draws a sample of the paper's
shape (each language's rows sampled with `random.Random(f'{sample_seed}:{language}')`, kept
in file order), not the paper's 220.

Prompt: a system message (`system_prompt`, default 'You are a helpful assistant.'), then a
zero-shot chain-of-thought user turn: the subject, the question, the options A-D and the
request to finish with 'The answer is (X)', ending "Answer: Let's think step by step.".

Extraction, in three passes: the last 'answer is X' (case-insensitive, X one of A-D,
optionally in brackets or bold), else the last 'Answer: X', else the last standalone letter
A-D (not inside a word: ASCII letters and digits around it). If all fail, a random guess:
a letter drawn from a generator seeded by (`seed`, the item's id, the text), so the same
text scores the same on every run with that seed; the Score's `extracted` is then None and
its detail records {'method': 'guess', 'guessed': True, 'guess': letter, 'seed': seed}.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from typing import Any, ClassVar

from spec_jax import data_files
from spec_jax.eval.tasks import fast_hsd
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.sources import FAST_HSD, hub_error, local_file, read_rows

HUB_ID = 'CohereLabs/include-base-44'
LETTERS = 'ABCD'
DEFAULT_SYSTEM_PROMPT = 'You are a helpful assistant.'
META_FIELDS = ('language', 'country', 'domain', 'subject', 'regional_feature', 'level')

USER_TEMPLATE = (
    'The following is a multiple choice question{about}. Think step by step and then finish '
    'your answer with "The answer is (X)" where X is the letter of the correct option.\n\n'
    'Question: {question}\n'
    'A. {option_a}\n'
    'B. {option_b}\n'
    'C. {option_c}\n'
    'D. {option_d}\n'
    "Answer: Let's think step by step."
)

# A letter A-D that is not part of a word or number.
_LETTER = r'(?<![A-Za-z0-9])[(\[]?\s*([A-D])\s*[)\]]?(?![A-Za-z0-9])'
_ANSWER_IS = re.compile(r'(?i:answer\s+is)\s*[:：]?\s*[*_]*\s*' + _LETTER)
_ANSWER_COLON = re.compile(r'(?i:answer)\s*[:：]\s*[*_]*\s*' + _LETTER)
_STANDALONE = re.compile(r'(?<![A-Za-z0-9])([A-D])(?![A-Za-z0-9])')


def extract_choice(text: str) -> tuple[str | None, str]:
    """(letter, method) of a model's answer; method 'answer is', 'Answer:' or 'standalone',
    or (None, 'none') when the text has no letter A-D at all."""
    for method, pattern in (
        ('answer is', _ANSWER_IS),
        ('Answer:', _ANSWER_COLON),
        ('standalone', _STANDALONE),
    ):
        found = pattern.findall(text)
        if found:
            return found[-1], method
    return None, 'none'


def guess(seed: int, item_id: str, text: str) -> str:
    """The seeded random guess for a text with no answer letter (deterministic)."""
    digest = hashlib.sha256(f'{seed}\0{item_id}\0{text}'.encode()).digest()
    return random.Random(digest).choice(LETTERS)


def gold_letter(answer: Any) -> str:
    """The right option's letter from the `answer` field (0-3; a letter A-D is accepted)."""
    if isinstance(answer, str) and answer.strip().upper() in tuple(LETTERS):
        return answer.strip().upper()
    index = int(answer)
    if not 0 <= index < len(LETTERS):
        raise ValueError(f'INCLUDE answer {answer!r} is not 0-3')
    return LETTERS[index]


@dataclasses.dataclass(frozen=True)
class INCLUDE:
    """INCLUDE (include-base-44, 4-option MCQ in 44 languages; see the module docstring)."""

    root: str = ''
    seed: int = 0
    languages: tuple[str, ...] = ()
    split: str = 'test'
    per_language: int = 0
    sample_seed: int = 42
    system_prompt: str = DEFAULT_SYSTEM_PROMPT

    scored: ClassVar[bool] = True
    name: ClassVar[str] = 'include'
    relpath: ClassVar[str] = 'include/test.jsonl'
    hub_id: ClassVar[str] = HUB_ID

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        if limit < 0:
            raise ValueError(f'limit must be >= 0, got {limit}')
        if self.per_language < 0:
            raise ValueError(f'per_language must be >= 0, got {self.per_language}')
        if source == FAST_HSD:
            if self.per_language:
                raise ValueError(
                    f"per_language={self.per_language} with source 'fast_hsd': the paper's 220 "
                    'are already 5 per language and are not resampled; set per_language=0'
                )
            wanted = set(self.languages)
            rows = [r for r in fast_hsd.include_rows() if not wanted or r['language'] in wanted]
            items = [self._item(row['id'], row) for row in rows]
            return items[:limit] if limit else items
        if source == '':
            rows = self._root_rows()
        elif source == 'hub':
            rows = self._hub_rows()
        else:
            rows = read_rows(local_file(source, self.relpath))
        items = self._select(rows)
        return items[:limit] if limit else items

    def score(self, item: Item, text: str) -> Score:
        """Extracts the letter (three passes, else a seeded guess) and compares it."""
        letter, method = extract_choice(text)
        if letter is not None:
            return Score(letter == item.gold, letter, {'method': method, 'guessed': False})
        guessed = guess(self.seed, item.id, text)
        detail = {'method': 'guess', 'guessed': True, 'guess': guessed, 'seed': self.seed}
        return Score(guessed == item.gold, None, detail)

    def _select(self, rows: list[dict]) -> list[Item]:
        wanted = set(self.languages)
        by_language: dict[str, list[tuple[int, dict]]] = {}
        for row in rows:
            language = str(row.get('language', ''))
            if wanted and language not in wanted:
                continue
            group = by_language.setdefault(language, [])
            group.append((len(group), row))
        items = []
        for language, group in by_language.items():
            if self.per_language and len(group) > self.per_language:
                rng = random.Random(f'{self.sample_seed}:{language}')
                keep = set(rng.sample(range(len(group)), self.per_language))
                group = [entry for k, entry in enumerate(group) if k in keep]
            items += [self._item(f'{language}/{index}', row) for index, row in group]
        return items

    def _item(self, item_id: str, row: dict) -> Item:
        subject = str(row.get('subject') or '').strip()
        user = USER_TEMPLATE.format(
            about=f' about {subject}' if subject else '',
            question=str(row['question']).strip(),
            **{f'option_{c}': str(row[f'option_{c}']).strip() for c in 'abcd'},
        )
        return Item(
            task=self.name,
            id=item_id,
            messages=(
                {'role': 'system', 'content': self.system_prompt},
                {'role': 'user', 'content': user},
            ),
            gold=gold_letter(row['answer']),
            meta={key: row.get(key) for key in META_FIELDS},
        )

    def _root_rows(self) -> list[dict]:
        return data_files.read_jsonl(self.relpath, self.root, 'data_root')

    def _hub_rows(self) -> list[dict]:
        try:
            import datasets

            configs = list(self.languages) or datasets.get_dataset_config_names(HUB_ID)
            rows = []
            for config in configs:
                rows += list(datasets.load_dataset(HUB_ID, config, split=self.split))
            return rows
        except Exception as e:  # Network, hub or file errors: name what was being loaded.
            instead = (
                f"a local file in INCLUDE's schema, or source '' with {self.relpath} under the "
                f'data root (data_root or ${data_files.ENV_VAR}).'
            )
            raise hub_error(f'{HUB_ID!r} (split {self.split!r})', e, instead) from e


TASKS = {INCLUDE.name: INCLUDE}
