"""The tiny model as a pre-quantized GPTQ checkpoint, for tests/workers/test_gptq_worker.py and
tests/trainer/test_gptq_train.py (needs gptqmodel and optimum: the callers skip without them)."""

from pathlib import Path

import pytest

TARGETS = ["q_proj", "v_proj", "down_proj"]
GROUP = 32
CALIBRATION = ["Alice says: Bob is a knave. Bob says: Alice and I are both knights. Who is a knight?",
               "A very special island is inhabited only by knights and knaves. Knights always tell the truth."] * 8


def quantize_tiny(out: Path) -> Path:
    """The tiny model quantized by gptqmodel on CPU into `out`: a GPTQ checkpoint directory (config.json
    carries quantization_config, quant_method gptq). ~3 s after gptqmodel's import."""
    from logicrl.models.loading import checkpoint_dir

    out.parent.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        # gptqmodel 7.6 asks its pool for 2 loader threads and gives the CPU (cores + 1) // 2 workers: 1
        # on this 2-core machine, which it then refuses. It also writes logs/ into the working directory.
        mp.setenv("GPTQMODEL_CPU_WORKERS", "2")
        mp.chdir(out.parent)
        from gptqmodel import GPTQModel, QuantizeConfig

        model = GPTQModel.load(str(checkpoint_dir("embedded:tiny")),
                               QuantizeConfig(bits=4, group_size=GROUP, desc_act=False, sym=True), device="cpu")
        model.quantize(CALIBRATION, batch_size=4)
        model.save(str(out))
    return out
