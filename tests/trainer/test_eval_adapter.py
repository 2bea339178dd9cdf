"""eval.checkpoints' LoRA adapter: merged over its base into a plain HF directory (trainer/evaluation.py
merge_adapter) that computes what the base with the adapter computes."""

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from logicrl.models.loading import checkpoint_dir
from logicrl.models.tiny import EMBEDDED_TINY
from logicrl.trainer.evaluation import merge_adapter


def test_merged_adapter_computes_as_the_adapter(tmp_path):
    base = checkpoint_dir(EMBEDDED_TINY)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():  # lora_B starts at zero: give the adapter something to say
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(str(tmp_path / "adapter"))
    out = merge_adapter(tmp_path / "adapter", EMBEDDED_TINY, tmp_path / "merged")
    assert (out / "config.json").is_file() and any(out.glob("tokenizer*"))
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(tmp_path / "adapter"))
    plain = AutoModelForCausalLM.from_pretrained(str(base))
    with torch.no_grad():
        want, got, without = adapted(ids).logits, merged(ids).logits, plain(ids).logits
    assert torch.allclose(got, want, atol=1e-4) and not torch.allclose(got, without, atol=1e-3)
