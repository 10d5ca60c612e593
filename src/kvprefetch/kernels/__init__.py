"""Calling a tree's compiled paged-attention ops the way vLLM 0.10.2 does (``ops``), on random
inputs in vLLM's paged layouts (``kvinputs``)."""
