"""Coverage-guided fuzzing of the parsers that read bytes from the network or the disk.

`targets` holds one function per parser; each takes arbitrary bytes and may raise only
the errors that parser documents for bad input (anything else, a hang or a runaway
allocation is a bug). `python -m tests.fuzz TARGET --runs N` (or `make fuzz`) drives them
with atheris (libFuzzer's coverage guidance), growing `corpus/TARGET/`; the default suite
replays every saved input (`tests/fuzz/test_corpus.py`), so an input that once found a
bug stays a regression test.
"""
