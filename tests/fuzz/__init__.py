"""The fuzz harness (issue 13): mutants of real GGUF files (both demo lanes
and the Gemma 3 270M file of the test extra) run through ``load_gguf``, the
model loader and a 4-token ``generate``, each in its own process with a
timeout and a memory cap. ``layout`` finds the header fields, ``mutate``
builds mutants, ``runner`` runs and classifies them, ``known`` lists the
loader failures another branch fixes, ``__main__`` is the command
(``python -m tests.fuzz --help``) and ``test_fuzz`` the bounded CI run.
docs/fuzz.md has the command and the results table."""
