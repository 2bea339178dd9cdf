"""The embedded tiny model's tokenizer: a byte-level BPE trained on the project's own K&K text.

No tokenizer can be downloaded, so this one is trained here, in under a second, from text the project
generates with a fixed seed: K&K puzzles of 2 to 8 people in both prompt templates, each followed by a
response in the shape the reward expects. Puzzles tokenize at about one token a word (a 3-person
qwen-instruct prompt is ~230 tokens), and any other NFC text still round-trips through the 256 byte
tokens. The vocabulary is what the corpus needs (763 tokens), below TINY_CONFIG["vocab_size"].

It follows Qwen2's tokenizer, so code written against the tiny model behaves as with Qwen: the same
NFC normalizer, pre-tokenizer regex (digits one at a time) and byte-level alphabet; `<|endoftext|>`
(pad, and the fallback end), `<|im_start|>` and `<|im_end|>` (the chat eos) as special tokens; a ChatML
template. One departure, on purpose: `<think>`, `</think>`, `<answer>`, `</answer>` are single added
tokens (not special, so decoding keeps them), which lets a tiny model learn the format reward.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")

# Qwen2's pre-tokenizer split (from its tokenizer.json).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2's ChatML, without the default system message Qwen2.5 inserts when there is none (a
# K&K prompt brings its own) and without tool calls. `continue_final_message` needs nothing
# here: transformers renders the whole chat and cuts it after the last message's content.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Everything that decides the trained tokenizer; its hash names the cache directory, so bump
# `version` when the training code changes in a way these values do not show.
RECIPE = {
    "version": 1,
    "seed": 0,
    "people": [2, 3, 4, 5, 6, 7, 8],
    "puzzles_per_size": 300,
    "special_tokens": list(SPECIAL_TOKENS),
    "tag_tokens": list(TAG_TOKENS),
    "split_pattern": SPLIT_PATTERN,
    "chat_template": CHAT_TEMPLATE,
}

_ATOMIC = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TAG_TOKENS))


def recipe_text() -> dict:
    """The project wording the corpus is made of, hashed with RECIPE so a rewording rebuilds the cache."""
    from logicrl.data.kk import render, templates

    return {"instructions": templates.INSTRUCTIONS, "preamble": render.PREAMBLE,
            "question": render.QUESTION, "sayings": list(render.SAYINGS), "names": list(render.NAMES)}


def corpus() -> Iterator[str]:
    """The training documents: one prompt + response per puzzle, alternating the two templates."""
    import numpy as np

    from logicrl.data.kk.generator import generate_puzzles
    from logicrl.data.kk.render import render_puzzle, render_solution, sample_names
    from logicrl.data.kk.statements import render
    from logicrl.data.kk.templates import base, qwen_instruct

    puzzle_rng = np.random.default_rng([RECIPE["seed"], 0])
    text_rng = np.random.default_rng([RECIPE["seed"], 1])
    for n_people in RECIPE["people"]:
        for i, puzzle in enumerate(generate_puzzles(RECIPE["puzzles_per_size"], n_people, puzzle_rng)):
            names = sample_names(text_rng, n_people)
            quiz = render_puzzle(puzzle, names, text_rng)
            # A knight's statement is true and a knave's false: a one-line-per-person "proof"
            # that gives the vocabulary the words a reasoning trace needs (so, true, false, it).
            reasons = " ".join(
                f"{name} is {'a knight' if knight else 'a knave'}, so it is "
                f"{'true' if knight else 'false'} that {render(statement, names)}."
                for name, knight, statement in zip(names, puzzle.solution, puzzle.statements)
            )
            answer = f" {reasons} </think>\n<answer> {render_solution(names, puzzle.solution)} </answer>"
            if i % 2:
                yield base(quiz)[0]["content"] + answer + PAD_TOKEN
            else:
                system, user, assistant = qwen_instruct(quiz)
                yield "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in (system, user)) \
                    + f"<|im_start|>assistant\n{assistant['content']}{answer}<|im_end|>\n"


def _pieces(documents: Iterator[str]) -> Iterator[str]:
    # The trainer knows nothing of added tokens, so it is fed the text between them, as the
    # finished tokenizer will see it; otherwise it would spend merges spelling "<|im_start|>".
    for doc in documents:
        yield from (piece for piece in _ATOMIC.split(doc) if piece)


def train_tiny_tokenizer(max_vocab_size: int):
    """A transformers PreTrainedTokenizerFast, trained from scratch on `corpus()`; deterministic."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Exactly Qwen2's pipeline: transformers loads any qwen2 checkpoint through Qwen2Tokenizer,
    # which rebuilds the tokenizer from vocab + merges with these parts, so anything else
    # saved here would silently differ from what AutoTokenizer returns.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=max_vocab_size - len(TAG_TOKENS),  # room for the tags added below
        special_tokens=list(SPECIAL_TOKENS),  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen or not
        show_progress=False,
    )
    tokenizer.train_from_iterator(_pieces(corpus()), trainer)
    # Added after training: added before, they would collide with the ids the trainer assigns.
    tokenizer.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TAG_TOKENS])

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
        # Cleaning up spaces would turn " ." into "." on decode and break round trips.
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    assert len(wrapped) <= max_vocab_size, f"trained {len(wrapped)} tokens, more than {max_vocab_size}"
    return wrapped
