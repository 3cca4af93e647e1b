"""The fuzz harness (issues 13 and 24): mutants of real GGUF files (both demo
lanes and the Gemma 3 270M file of the test extra) run through ``load_gguf``,
the model loader (which builds the file's tokenizer), the chat template
(compiled and rendered where the file has one) and a 4-token ``generate``,
each in its own process with a timeout and a memory cap. ``layout`` finds
the header fields, ``mutate`` builds mutants (``tokenizer_mutants`` those of
the tokenizer keys and the chat template), ``runner`` runs and classifies
them, ``known`` lists the fixed failures replayed every run, ``__main__`` is the command
(``python -m tests.fuzz --help``) and ``test_fuzz`` the bounded CI run.
docs/fuzz.md has the command and the results table."""
