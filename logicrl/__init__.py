"""logicrl: declarative, memory-predictable RL for LLMs (verl / Logic-RL style)."""

__version__ = "0.1.0"

# peft imports torchao whenever it is installed (the quant extra, models/quantize.py), and torchao then
# logs, in every process, a warning per CUDA-only extension a CPU build of torch cannot load, and torch
# two about enums it registers: none of which logicrl uses (its NF4 path is pure torch). Set before
# anything imports them, so that a run's stderr stays what logicrl says.
import logging as _logging

_logging.getLogger("torchao").setLevel(_logging.ERROR)
_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)
