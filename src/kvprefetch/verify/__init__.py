"""``verify-kernel``'s evidence: which library each tree loads (``kernel``), the machine code
(``sass``, ``cubin``) and, on a GPU, bitwise outputs against a float64 reference
(``numerics``, ``reference``)."""
