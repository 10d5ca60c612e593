"""Building the trees: the frozen plan (``plan``), the toolkit it uses (``toolchain``), the
environments it builds into (``envs``), which instantiations a narrowed build compiles
(``selection``), and the two executors: the kernels-only extension (``kernels_only``) and the
full vLLM build (``builder``)."""
