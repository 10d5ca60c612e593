"""The work directory the kit owns: its layout (``workdir``), what the kit made there
(``ownership``), per-tree locks (``locks``), transactional tree edits (``treetxn``), and what
``clean`` and ``--repair`` may remove (``cleaning``, ``repair``)."""
