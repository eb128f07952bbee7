"""The eval loops of Flax's examples, converted to padded_eval: see common.py and HOWTO.md."""
