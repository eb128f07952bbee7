"""XLA's own CPU code generation, named for the tests that compare with it.

The suite compiles with XLA's fusion emitters off (``--xla_cpu_use_fusion_emitters=false``, set by
the repository's conftest.py): its thousands of small programs compile faster (files of the suite
ran 15-30% faster), and, with pytest-xdist's workers, in one codegen part per program
(``--xla_cpu_parallel_codegen_split_count=1``). masked_eval itself sets no XLA option: it compiles
what ``jax.jit`` compiles. A test that checks a promise at XLA's defaults (error-free
transformations that XLA could contract or reassociate, results bit for bit with XLA's defaults)
compiles with `XLA_DEFAULTS`.
"""

XLA_DEFAULTS = {"xla_cpu_use_fusion_emitters": True}
"""``compiler_options`` for XLA's default CPU code generation (overrides the suite's XLA_FLAGS)."""
