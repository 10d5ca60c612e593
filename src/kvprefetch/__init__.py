"""kvprefetch: an asynchronous KV-cache L2 prefetch for vLLM v0.10.2's PagedAttention decode
kernel, with the tooling to build stock and patched side by side and prove what each one runs."""

__version__ = "0.1.0"
