"""Building the trees, one way for every mode (issue 45). Named ``builds`` rather than
``build``, which tools and ignore rules read as build output.

- ``options``: the options as given (``BuildOptions``) and what the mode resolved
  (``ModeInputs``);
- ``plan``: the frozen ``BuildPlan`` / ``TreePlan`` / ``Step`` and what every plan shares (the
  key, the source hash, the tree's variant, ``render_plan``);
- ``pipeline``: ``prepare_build`` -> ``make_plan`` -> ``execute``, asking the registry for the
  mode;
- ``modes/``: the ``BuildMode`` interface (``base``), the registry (``__init__``) and one
  module per mode: ``kernels_only``, ``overlay``, ``full``, ``smoke``;
- ``sequence``: one tree's build, the same for every mode (locks, the up-to-date check, logs,
  the environment, named steps, the manifest's core);
- ``library``: the kernels library the kernels-only and overlay modes compile;
- ``full_smoke``: the smoke's parts (its inputs, the tree copy, the toolkit view, the check);
- ``foresight``: a plan's estimate and whether to ask before building.

Below it: doctor (each mode's preflight calls it), overlay (the overlay's own parts), machine
(toolchains, environments, torch's probe, the pure foresight), sources, workspace."""
