"""The tiny model's tokenizer and checkpoint directory: round trips, tags, ChatML, caching."""

import json
import shutil

import numpy as np

from logicrl.data.kk.build import build_splits
from logicrl.data.kk.generator import generate_puzzles
from logicrl.data.kk.render import render_puzzle, render_solution, sample_names
from logicrl.models import tiny
from logicrl.models.tiny import (
    EMBEDDED_CONFIGS,
    EMBEDDED_TINY,
    EMBEDDED_TINY_RM,
    TINY_CONFIG,
    cache_root,
    tiny_checkpoint_dir,
)
from logicrl.models.tiny_tokenizer import SPECIAL_TOKENS, TAG_TOKENS, train_tiny_tokenizer


def puzzle_texts(n_people, count, seed):
    """Puzzles and solutions from a seed the tokenizer's corpus does not use."""
    rng = np.random.default_rng(seed)
    texts = []
    for puzzle in generate_puzzles(count, n_people, rng):
        names = sample_names(rng, n_people)
        texts += [render_puzzle(puzzle, names, rng), render_solution(names, puzzle.solution)]
    return texts


def test_puzzles_and_other_text_round_trip(tokenizer):
    texts = puzzle_texts(3, 5, seed=123) + puzzle_texts(8, 5, seed=123) + [
        "<think> Zoey is a knight, so Oliver lies. </think>\n<answer> (1) Zoey is a knight </answer>",
        "Unseen text: naïve café, 日本語, emoji 🙂, tabs\tand  double  spaces, 12345.",
    ]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_puzzle_words_are_single_tokens(tokenizer):
    # Trained on the puzzles, the tokenizer spends one token per word or punctuation mark.
    tokens = tokenizer.tokenize("Zoey says that Oliver is a knave if and only if Emma is a knight.")
    assert tokens == ["Zoey", "Ġsays", "Ġthat", "ĠOliver", "Ġis", "Ġa", "Ġknave", "Ġif", "Ġand", "Ġonly",
                      "Ġif", "ĠEmma", "Ġis", "Ġa", "Ġknight", "."]


def test_tags_are_single_tokens_that_decoding_keeps(tokenizer):
    for tag in TAG_TOKENS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1, tag
    text = "<|im_start|>assistant\n<think> x </think><answer> y </answer><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert [t for t in tokens if t in TAG_TOKENS] == list(TAG_TOKENS)
    # Tags are not special: a decode that drops the ChatML markers keeps them for the reward.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think> x </think><answer> y </answer>"


def test_special_tokens_and_config(cache, tokenizer):
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2]
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    config = json.loads((tiny_checkpoint_dir(cache) / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer) <= TINY_CONFIG["vocab_size"]
    # What the preflight plans with before anything is built (models/tiny.py EMBEDDED_CONFIGS).
    assert config["vocab_size"] == EMBEDDED_CONFIGS[EMBEDDED_TINY]["vocab_size"] == \
        EMBEDDED_CONFIGS[EMBEDDED_TINY_RM]["vocab_size"]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 2, 0)
    assert {k: v for k, v in config.items() if k in TINY_CONFIG and k != "vocab_size"} == \
        {k: v for k, v in TINY_CONFIG.items() if k != "vocab_size"}


def test_chat_template_continues_final_message(tokenizer):
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "<think>"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>"
    text = tokenizer.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_three_person_kk_prompt_is_well_under_512_tokens(tokenizer):
    rows = build_splits(3, 20, 5, "qwen-instruct", seed=7)["train"]
    lengths = [len(tokenizer.apply_chat_template(row["prompt"], continue_final_message=True)["input_ids"])
               for row in rows]
    assert max(lengths) < 300, lengths


def test_auto_tokenizer_loads_exactly_what_training_makes(tokenizer):
    # transformers rebuilds any qwen2 tokenizer from vocab + merges (Qwen2Tokenizer); this
    # proves nothing is lost on the way, and that training is deterministic.
    fresh = json.loads(train_tiny_tokenizer(TINY_CONFIG["vocab_size"]).backend_tokenizer.to_str())
    loaded = json.loads(tokenizer.backend_tokenizer.to_str())
    for part in ("normalizer", "pre_tokenizer", "decoder", "added_tokens"):
        assert loaded[part] == fresh[part], part
    assert loaded["model"]["vocab"] == fresh["model"]["vocab"]
    assert loaded["model"]["merges"] == fresh["model"]["merges"]


def test_checkpoint_dir_is_cached_under_the_root(cache, monkeypatch):
    first = tiny_checkpoint_dir(cache)
    assert tiny_checkpoint_dir(cache) == first
    assert first.parent == cache and first.name == f"tiny-{tiny.tiny_fingerprint()}"
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary directory left behind
    monkeypatch.setenv("LOGICRL_CACHE", str(cache / "from-env"))
    assert cache_root() == cache / "from-env"
    assert cache_root(cache) == cache


def test_losing_a_build_race_keeps_the_winners_directory(cache, tmp_path, monkeypatch):
    built = tiny_checkpoint_dir(cache)
    final = tmp_path / built.name

    def racing_write(path):
        # Another process finishes first while this one is still writing its own copy.
        shutil.copytree(built, final)
        shutil.copytree(built, path, dirs_exist_ok=True)
        (final / "winner").write_text("")

    monkeypatch.setattr(tiny, "_write_checkpoint", racing_write)
    assert tiny_checkpoint_dir(tmp_path) == final
    assert (final / "winner").exists()
    assert [p.name for p in tmp_path.iterdir()] == [final.name]
