"""A reward model with its own tokenizer reads each response decoded from the actor's tokens and
re-rendered with its own chat template, as verl's reward-model worker does; its scores equal a
direct HF forward of the texts it should read."""

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from logicrl.models.reward_model import load_reward_model, score_rows
from logicrl.models.rm_inputs import render, response_text, retokenize, same_tokenizer

# A Llama-3-like template: nothing like the tiny tokenizer's ChatML.
LLAMA_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
)
SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|pad|>"]
CORPUS = ["Zoey is a knight and Oliver is a knave.", "Who is a knight and who is a knave? Answer briefly.",
          "You are a helpful assistant. <think> reasoning </think> <answer> (1) Zoey is a knight </answer>"]


@pytest.fixture(scope="module")
def rm_tokenizer():
    """A second tokenizer built here: byte-level BPE with its own vocabulary, specials and template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 5, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|begin_of_text|>",
                                               eos_token="<|eot_id|>", pad_token="<|pad|>")
    tok.chat_template = LLAMA_TEMPLATE
    return tok


CHATS = [
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Who is a knight?"}],
    # K&K's templates open the assistant's turn; the actor continued it.
    [{"role": "user", "content": "Is Zoey a knave?"}, {"role": "assistant", "content": "<think>"}],
]
ANSWERS = [" Zoey is a knight.", " reasoning </think> <answer> (1) Zoey is a knave </answer>"]


def actor_rows(tokenizer, answers, eos=True, width=40):
    """The answers as the actor wrote them: its tokens, eos-ended, right-padded, with their mask."""
    rows = [tokenizer(a, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
            for a in answers]
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask


def expected_texts(rm_tokenizer):
    return [rm_tokenizer.apply_chat_template(CHATS[0] + [{"role": "assistant", "content": ANSWERS[0]}], tokenize=False),
            rm_tokenizer.apply_chat_template([CHATS[1][0], {"role": "assistant", "content": "<think>" + ANSWERS[1]}],
                                             tokenize=False)]


def test_tokenizers_are_compared(tokenizer, rm_tokenizer):
    assert same_tokenizer(tokenizer, tokenizer) and not same_tokenizer(tokenizer, rm_tokenizer)


def test_a_response_is_decoded_without_its_eos(tokenizer):
    ids, mask = actor_rows(tokenizer, ANSWERS)
    assert [response_text(r, m, tokenizer) for r, m in zip(ids, mask)] == ANSWERS


def test_rows_are_re_rendered_with_the_reward_models_template(tokenizer, rm_tokenizer):
    ids, mask = actor_rows(tokenizer, ANSWERS)
    rows = retokenize(CHATS, ids, mask, tokenizer, rm_tokenizer, max_length=200)
    texts = expected_texts(rm_tokenizer)
    assert texts[1].startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                               "Is Zoey a knave?<|eot_id|>")
    assert texts[1].endswith("<|start_header_id|>assistant<|end_header_id|>\n\n<think> reasoning </think> <answer> "
                             "(1) Zoey is a knave </answer><|eot_id|>")
    assert rows.truncated == 0
    for i, text in enumerate(texts):
        want = rm_tokenizer(text, add_special_tokens=False)["input_ids"]
        n = int(rows.attention_mask[i].sum())
        assert rows.input_ids[i, :n].tolist() == want
        assert rows.position_ids[i, :n].tolist() == list(range(n))
        assert (rows.input_ids[i, n:] == rm_tokenizer.pad_token_id).all()


def test_plain_prompts_and_long_rows(tokenizer, rm_tokenizer):
    ids, mask = actor_rows(tokenizer, ANSWERS[:1])
    assert render("Question: who?", ANSWERS[0], rm_tokenizer) == ("Question: who?" + ANSWERS[0], True)
    full = retokenize(CHATS[:1], ids, mask, tokenizer, rm_tokenizer, max_length=200)
    n = int(full.attention_mask[0].sum())
    cut = retokenize(CHATS[:1], ids, mask, tokenizer, rm_tokenizer, max_length=n - 5)
    # Cut from the left: the end the score is read at survives.
    assert cut.truncated == 1 and cut.input_ids[0].tolist() == full.input_ids[0, 5:n].tolist()


def test_scores_of_re_rendered_rows_equal_a_direct_hf_forward(tokenizer, rm_tokenizer, tmp_path):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=1,
                                      num_key_value_heads=1, head_dim=64, intermediate_size=128,
                                      vocab_size=len(rm_tokenizer), num_labels=1)
    hf = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():
        hf.score.weight.mul_(50)
    hf.save_pretrained(tmp_path)

    ids, mask = actor_rows(tokenizer, ANSWERS)
    rows = retokenize(CHATS, ids, mask, tokenizer, rm_tokenizer, max_length=200)
    model = load_reward_model(str(tmp_path), torch.float32)
    with torch.no_grad():
        want = torch.stack([hf(input_ids=torch.tensor([rm_tokenizer(t, add_special_tokens=False)["input_ids"]]))
                            .logits[0, 0] for t in expected_texts(rm_tokenizer)])
    for packed in (False, True):
        got = score_rows(model, rows.input_ids, rows.attention_mask, rows.position_ids, micro_batch_size=2,
                         remove_padding=packed)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
