"""XLA compilations counted while a test runs: JAX's compile event, one listener per test.

A test module takes the fixtures by import, ``from _compiles import compiles``, and names them as
arguments: ``compiles`` is the number of compilations so far (a one-element list, which the test may
set back to 0); ``compile_spans`` lists ``(thread name, start, end)`` of each (the listener runs on
the compiling thread). ``listening`` is the context manager under both.
"""

import contextlib
import threading
import time

import jax
import jax.monitoring
import pytest

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _unregister(listener):
  unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
  if unregister is None:  # jax < 0.9 (the floors)
    from jax._src import monitoring

    unregister = monitoring._unregister_event_duration_listener_by_callback  # noqa: SLF001
  unregister(listener)


@contextlib.contextmanager
def listening(on_compile):
  """Calls ``on_compile(duration_s)`` for every XLA compilation made while the block runs."""

  def listener(event, duration, **kwargs):
    del kwargs
    if event == COMPILE_EVENT:
      on_compile(duration)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield
  finally:
    _unregister(listener)


@pytest.fixture
def compiles():
  """The number of XLA compilations made while the test runs (a one-element list)."""
  seen = [0]

  def count(duration):
    del duration
    seen[0] += 1

  with listening(count):
    yield seen


@pytest.fixture
def compile_spans():
  """``(thread name, start, end)`` of every XLA compilation made while the test runs."""
  seen = []

  def span(duration):
    now = time.perf_counter()
    seen.append((threading.current_thread().name, now - duration, now))

  with listening(span):
    yield seen
