"""The backends every multi-backend test runs on: all of `padded_eval.eval.backends.BACKENDS`
(tests/conftest.py turns it into the ``backend`` fixture). A new backend is tested by registering it."""

from padded_eval.eval.backends import BACKENDS as REGISTERED

BACKENDS = tuple(REGISTERED)
