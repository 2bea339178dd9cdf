"""logicrl: declarative, memory-predictable RL for LLMs (verl / Logic-RL style)."""

__version__ = "0.1.0"
