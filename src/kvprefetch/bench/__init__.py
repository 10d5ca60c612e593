"""The benchmarks: ``matrix`` (what to run), ``kernel`` (timing both variants in one
process), ``ncu`` (the paper reproduction's attribution recipe), ``e2e`` (``vllm bench throughput``
per environment) and ``report`` (markdown and PNG from any of their JSON files)."""
