"""The multi-host pre-flight (`padded_eval.multihost._agreement`) against a request-counting coordination stub.

P processes are simulated on threads against one in-memory `CountingClient` (tests/_counting_client.py). The
first version read every other process's record: P + P*P requests at the coordinator. These tests check that
the pre-flight grows linearly (4P + 2 on success), that every process still gets the same agreement or the same
error naming the process and the leaf, and that a missing process is named in a TimeoutError, not waited for.
"""

import numpy as np
import pytest
from _counting_client import CountingClient, simulate

from padded_eval.multihost._agreement import agree, digest, record
from padded_eval.multihost._coordination import Peers, exchange

SETTINGS = {"backend": "pmap", "mask_key": "mask"}


def batch(width=3, rows=4):
  return {"x": np.zeros((rows, width), np.float32), "mask": np.ones(rows, bool)}


def run_preflight(count, mine, timeout=5.0, absent=(), saved=None):
  """``mine(p)`` -> process p's record; returns (outcomes, client)."""
  client = CountingClient(count)

  def one(process):
    return agree(
      mine(process), "0/preflight", timeout, "mask", saved, Peers(client, process, count)
    )

  return simulate(count, one, absent), client


def plain(process, length=10):
  return record(batch(), "mask", length, SETTINGS, None)


@pytest.mark.parametrize("count", [2, 8, 32, 128])
def test_requests_grow_linearly_in_the_process_count(count):
  outcomes, client = run_preflight(count, plain)
  assert all(o.num_steps == 10 and o.spec.batch_size == 4 for o in outcomes), outcomes
  # two sets, one barrier, one get per process; the checker's directory read, record get, verdict set.
  assert client.requests == 4 * count + 2, client.counts
  assert client.requests < count * count + count or count <= 4  # the first version's P + P*P


def test_request_count_is_linear_from_2_to_512_processes():
  counts = {}
  for count in (2, 16, 128, 512):
    counts[count] = run_preflight(count, plain)[1].requests
  slope = (counts[512] - counts[16]) / (512 - 16)
  assert slope <= 4.0 + 1e-9, counts  # requests per added process: constant
  assert all(counts[p] <= 5 * p for p in (16, 128, 512)), counts


def test_checker_reads_small_digests_and_fetches_one_full_record():
  wide = {f"feature_{i}": np.zeros((4, 7), np.float32) for i in range(40)}
  wide["mask"] = np.ones(4, bool)
  outcomes, client = run_preflight(16, lambda p: record(wide, "mask", 3, SETTINGS, None))
  assert len({o.spec.to_json().__repr__() for o in outcomes}) == 1
  assert client.counts["key_value_dir_get"] == 1 and client.counts["blocking_key_value_get"] == 16
  size = len(str(digest(record(wide, "mask", 3, SETTINGS, None))))
  assert size < 200  # fixed size, whatever the batch structure


def test_different_leaf_is_the_same_value_error_on_every_process():
  def mine(process):
    return record(batch(width=4 if process == 11 else 3), "mask", 10, SETTINGS, None)

  outcomes, client = run_preflight(16, mine)
  messages = {str(o) for o in outcomes}
  assert all(isinstance(o, ValueError) for o in outcomes), outcomes
  assert len(messages) == 1, messages
  (message,) = messages
  assert "process 11 differ from those of process 0" in message
  assert "'x' has shape (4, 4)" in message and "expected shape (4, 3)" in message
  assert client.requests <= 5 * 16


def test_different_setting_is_named_on_every_process():
  def mine(process):
    return record(
      batch(), "mask", 10, dict(SETTINGS, backend="jit" if process == 5 else "pmap"), None
    )

  outcomes, _ = run_preflight(8, mine)
  assert {type(o) for o in outcomes} == {ValueError}
  assert {str(o) for o in outcomes} == {
    "masked_eval got backend='jit' on process 5 but backend='pmap' on process 0; every process must "
    "pass the same"
  }


@pytest.mark.parametrize("failing", [3, 0])  # 0: the checker itself
def test_failure_before_the_first_step_reaches_every_other_process(failing):
  def mine(process):
    failure = "OSError: disk on fire" if process == failing else None
    return record(None, "mask", 10, SETTINGS, failure)

  outcomes, _ = run_preflight(6, mine)
  assert outcomes[failing] is None  # its caller re-raises its own failure
  for process in set(range(6)) - {failing}:
    assert isinstance(outcomes[process], RuntimeError)
    expected = f"process {failing} failed before the first step (OSError: disk on fire)"
    assert expected in str(outcomes[process])


@pytest.mark.parametrize("absent", [5, 0])
def test_missing_process_is_named_in_a_timeout_on_every_other_process(absent):
  outcomes, _ = run_preflight(8, plain, timeout=0.3, absent=(absent,))
  for process in set(range(8)) - {absent}:
    error = outcomes[process]
    assert isinstance(error, TimeoutError), error
    assert f"process(es) [{absent}] did not reach the pre-flight check within 0.3 s" in str(error)


def test_checker_dying_after_arriving_is_named():
  client = CountingClient(4)

  def one(process):
    if process == 0:  # arrives, then dies before publishing the verdict
      from padded_eval.multihost._coordination import arrive

      client.key_value_set("padded_eval/masked_eval/0/preflight/record/0", "{}")
      arrive(Peers(client, 0, 4), "0/preflight/digest", "{}", 5.0)
      return "died"
    return agree(plain(process), "0/preflight", 0.3, "mask", None, Peers(client, process, 4))

  outcomes = simulate(4, one)
  for error in outcomes[1:]:
    assert isinstance(error, TimeoutError)
    assert "process(es) [0] did not publish the pre-flight verdict within 0.3 s" in str(error)


def test_processes_without_data_get_the_spec_and_the_longest_length():
  def mine(process):
    if process % 2:
      return record(None, "mask", 0, SETTINGS, None)
    return record(batch(), "mask", process + 1, SETTINGS, None)

  outcomes, _ = run_preflight(7, mine)
  assert {o.num_steps for o in outcomes} == {7}
  assert all(o.spec.difference(outcomes[0].spec) is None for o in outcomes)
  unknown, _ = run_preflight(
    3, lambda p: record(batch(), "mask", None if p == 1 else 4, SETTINGS, None)
  )
  assert {o.num_steps for o in unknown} == {None}


def test_no_batch_anywhere_is_a_value_error_unless_resumed():
  outcomes, _ = run_preflight(3, lambda p: record(None, "mask", 0, SETTINGS, None))
  assert all("batches yielded no batch on any of the 3 processes" in str(o) for o in outcomes)
  saved = record(batch(), "mask", 0, SETTINGS, None)["batch"]
  resumed, _ = run_preflight(3, lambda p: record(None, "mask", 2, SETTINGS, None), saved=saved)
  assert {o.num_steps for o in resumed} == {2} and resumed[0].spec.batch_size == 4


def test_exchange_returns_everyones_payload_with_three_requests_each():
  count = 9
  client = CountingClient(count)
  outcomes = simulate(count, lambda p: exchange({"p": p}, "1/resume", 5.0, Peers(client, p, count)))
  assert all(o == [{"p": p} for p in range(count)] for o in outcomes), outcomes
  assert client.requests == 3 * count


def test_private_coordination_client_is_where_jax_keeps_it():
  """padded_eval.multihost._coordination.service_client reads jax._src.distributed.global_state.client: if JAX moves it,
  this fails here, loudly, instead of in a multi-host run."""
  from jax._src import distributed as jax_distributed
  from jax._src.lib import _jax

  from padded_eval.multihost._coordination import service_client

  assert hasattr(jax_distributed.global_state, "client")
  used = ("key_value_set", "blocking_key_value_get", "key_value_dir_get", "wait_at_barrier")
  for method in used:
    assert hasattr(_jax.DistributedRuntimeClient, method), method
  if jax_distributed.global_state.client is None:
    with pytest.raises(RuntimeError, match="jax.distributed is not initialized"):
      service_client()


def test_stub_counts_an_all_to_all_read_quadratically():
  """The first version's pattern (one set, then one blocking get of every process's key) counts P + P*P:
  the stub sees every request, so the linear counts above are not an artifact of the stub."""
  for count in (4, 16, 64):
    client = CountingClient(count)

    def one(process, client=client, count=count):
      client.key_value_set(f"all/{process}", str(process))
      return [int(client.blocking_key_value_get(f"all/{p}", 5000)) for p in range(count)]

    outcomes = simulate(count, one)
    assert all(o == list(range(count)) for o in outcomes)
    assert client.requests == count + count * count
