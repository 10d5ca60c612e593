"""Where the trees come from: vLLM 0.10.2's pins (``upstream``), the hash-checked sdist or git
clone (``download``, ``fetch``), the kit's patch variants (``patching``) and the pinned
FetchContent dependencies of a full build (``deps``)."""
