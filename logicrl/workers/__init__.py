"""Workers: the actor / critic / reference (FSDP2) and the rollout engines (HF, vLLM).

Plain classes that tests build directly; Ray only places them and calls their methods.
"""
