"""The real world's models: a byte-level target LM trained on the Python standard library's
own text, a DSpark block drafter and a confidence head, with their committed weights and
held-out samples (docs/runtime.md, "The real world's models")."""
