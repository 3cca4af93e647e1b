"""The fuzz harness: mutants of real GGUF files (both demo lanes, the Gemma 3
270M file of the test extra, a Muse Glimmer file with a 202,048-token BPE and
a split file) run through ``load_gguf``,
the model loader (which builds the file's tokenizer), the chat template
(compiled and rendered where the file has one) and a 4-token ``generate``,
each in its own process with a timeout and a memory cap. ``layout`` finds
the header fields, ``mutate`` builds mutants (``tokenizer_mutants`` those of
the tokenizer keys and the chat template), ``targets`` names the files (and
mutates a split model one part at a time; ``glimmer_file`` builds the
202,048-token file), ``runner`` runs and classifies
them, ``known`` lists the fixed failures replayed every run, ``__main__`` is the command
(``python -m tests.fuzz --help``), ``test_fuzz`` the bounded CI run and
``test_targets`` the checks of the built files.
docs/fuzz.md has the command and the results table."""
