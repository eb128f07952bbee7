"""masked_eval(mask_fn=...) on pytree batches: jraph GraphsTuples (one padded graph batch per row, stacked on a
leading axis) and plain tuples, against numpy float64 references. Padding nodes and padding graphs' labels hold
NaN, so a step that does not mask before the arithmetic gives NaN."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.data._batch_spec import BatchSpec

jraph = pytest.importorskip("jraph")

FEATURES = 3
NODE_BUDGET, EDGE_BUDGET, GRAPH_BUDGET = 16, 24, 5  # per padded graph batch (one graph is padding)
graph_mask = jax.vmap(jraph.get_graph_padding_mask)  # [rows, graphs] for stacked graph batches


def random_graphs(n, seed=0):
  """``n`` small graphs (1-5 nodes, 0-6 edges) with float node features and a float label in ``globals``."""
  rng = np.random.default_rng(seed)
  graphs = []
  for _ in range(n):
    nodes, edges = int(rng.integers(1, 6)), int(rng.integers(0, 7))
    graphs.append(
      jraph.GraphsTuple(
        nodes=rng.normal(size=(nodes, FEATURES)).astype(np.float32),
        edges=rng.normal(size=(edges, 1)).astype(np.float32),
        senders=rng.integers(0, nodes, size=edges).astype(np.int32),
        receivers=rng.integers(0, nodes, size=edges).astype(np.int32),
        n_node=np.array([nodes], np.int32),
        n_edge=np.array([edges], np.int32),
        globals=rng.normal(size=(1, 1)).astype(np.float32),
      )
    )
  return graphs


def empty_graph():
  """A GraphsTuple of no graph: padded by jraph, it is all padding (its mask is all False)."""
  return jraph.GraphsTuple(
    nodes=np.zeros((0, FEATURES), np.float32),
    edges=np.zeros((0, 1), np.float32),
    senders=np.zeros(0, np.int32),
    receivers=np.zeros(0, np.int32),
    n_node=np.zeros(0, np.int32),
    n_edge=np.zeros(0, np.int32),
    globals=np.zeros((0, 1), np.float32),
  )


def with_nan_padding(padded):
  """Padding nodes and the padding graphs' labels hold NaN."""
  real_graphs = np.asarray(jraph.get_graph_padding_mask(padded))
  real_nodes = int(np.asarray(padded.n_node)[real_graphs].sum())
  nodes = np.array(padded.nodes)
  nodes[real_nodes:] = np.nan
  labels = np.array(padded.globals)
  labels[~real_graphs] = np.nan
  return padded._replace(nodes=nodes, globals=labels)


def padded_graph_batches(graphs):
  """Fixed-budget padded GraphsTuples (jraph.dynamically_batch), padding as NaN."""
  batches = jraph.dynamically_batch(iter(graphs), NODE_BUDGET, EDGE_BUDGET, GRAPH_BUDGET)
  return [with_nan_padding(jax.tree.map(np.asarray, b)) for b in batches]


def stacked(padded, rows):
  """Groups of `rows` padded graph batches stacked on a new leading axis (leaves [rows, ...]); the last group
  is completed with all-padding graph batches."""
  filler = jraph.pad_with_graphs(empty_graph(), NODE_BUDGET, EDGE_BUDGET, GRAPH_BUDGET)
  padded = padded + [filler] * (-len(padded) % rows)
  groups = [padded[i : i + rows] for i in range(0, len(padded), rows)]
  return [jax.tree.map(lambda *leaves: np.stack(leaves), *group) for group in groups]


def predict(weights, graph):
  """Per graph: the sum over its nodes of ``nodes @ weights`` -> [graphs]."""
  n_graph, n_nodes = graph.n_node.shape[0], graph.nodes.shape[0]
  graph_of_node = jnp.repeat(jnp.arange(n_graph), graph.n_node, total_repeat_length=n_nodes)
  return jax.ops.segment_sum(graph.nodes @ weights, graph_of_node, n_graph)


def counting_step(traces):
  def step_fn(weights, graphs):  # graphs: leaves [rows, ...], one padded graph batch per row
    traces.append(graphs.nodes.shape)
    preds = jax.vmap(predict, in_axes=(None, 0))(weights, graphs)  # [rows, graphs]
    errors = (preds - graphs.globals[..., 0]) ** 2
    return pe.metrics.Mean().batch_updates(values=errors, mask=graph_mask(graphs))

  return step_fn


def reference_mse(graphs, weights):
  w = weights.astype(np.float64)
  errors = [
    (np.sum(g.nodes.astype(np.float64) @ w) - np.float64(g.globals[0, 0])) ** 2 for g in graphs
  ]
  return np.mean(errors)


WEIGHTS = np.array([0.5, -1.0, 2.0], np.float32)


def test_one_padded_graph_batch_per_device(backend):
  graphs = random_graphs(41)
  batches = stacked(padded_graph_batches(graphs), jax.local_device_count())
  traces = []
  result = pe.masked_eval(
    counting_step(traces), WEIGHTS, batches, backend=backend, mask_fn=graph_mask
  )
  assert len(traces) == 1, traces
  assert result["num_examples"] == 41
  np.testing.assert_allclose(result["mean"], reference_mse(graphs, WEIGHTS), rtol=1e-6)


def test_one_device():
  graphs = random_graphs(17, seed=1)
  batches = stacked(padded_graph_batches(graphs), rows=1)
  traces = []
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
  result = pe.masked_eval(
    counting_step(traces), WEIGHTS, batches, backend="jit", mesh=mesh, mask_fn=graph_mask
  )
  assert len(traces) == 1 and result["num_examples"] == 17
  np.testing.assert_allclose(result["mean"], reference_mse(graphs, WEIGHTS), rtol=1e-6)


def tuple_mask(batch):
  return batch[1]


def test_tuple_batches_with_mask_fn_and_progress():
  rng = np.random.default_rng(2)
  values = rng.normal(size=30).astype(np.float32)
  batches = []
  for start in range(0, 30, 16):
    x = np.full(16, np.nan, np.float32)
    real = values[start : start + 16]
    x[: len(real)] = real
    batches.append((x, np.arange(16) < len(real)))
  step = lambda p, b: pe.metrics.Mean().batch_updates(values=b[0], mask=b[1])
  result = pe.masked_eval(step, None, batches, mask_fn=tuple_mask, progress=True)
  np.testing.assert_allclose(result["mean"], values.astype(np.float64).mean(), rtol=1e-6)
  assert result["num_examples"] == 30


def dict_mask(batch):
  return batch["keep"]


def test_dict_batches_may_use_mask_fn_instead_of_mask_key():
  x = np.array([1.0, 2.0, np.nan, 4.0, np.nan, np.nan, 7.0, np.nan], np.float32)
  keep = ~np.isnan(x)
  step = lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"], mask=b["keep"])
  result = pe.masked_eval(step, None, [{"x": x, "keep": keep}], mask_fn=dict_mask)
  assert result == {"mean": pytest.approx(np.mean(x[keep].astype(np.float64))), "num_examples": 4}


def test_the_count_follows_mask_fn_not_the_step():
  """num_examples counts mask_fn's True elements: graphs, not rows."""
  graphs = random_graphs(9, seed=3)
  batches = stacked(padded_graph_batches(graphs), jax.local_device_count())
  step = lambda w, g: pe.metrics.Mean().batch_updates(values=g.n_node.astype(jnp.float32))
  result = pe.masked_eval(step, WEIGHTS, batches, backend="jit", mask_fn=graph_mask)
  assert result["num_examples"] == 9


def test_pytree_batches_must_keep_their_structure_and_shapes():
  graphs = random_graphs(12, seed=4)
  first = stacked(padded_graph_batches(graphs), 2)[0]
  spec = BatchSpec.from_batch(first, mask_fn=graph_mask)
  assert spec.batch_size == 2 and spec.leaves[("nodes",)].shape == (NODE_BUDGET, FEATURES)
  bigger = jraph.pad_with_graphs(graphs[0], NODE_BUDGET + 1, EDGE_BUDGET, GRAPH_BUDGET)
  bigger = [jax.tree.map(lambda *leaves: np.stack(leaves), bigger, bigger)]
  with pytest.raises(ValueError, match=r"batch 1: key 'nodes' has shape \(2, 17, 3\); expected"):
    spec.check(bigger[0], 1)
  as_dict = dict(first._asdict())
  with pytest.raises(ValueError, match=r"batch 1 has structure"):
    spec.check(as_dict, 1)
  ragged = first._replace(globals=first.globals[:1])
  with pytest.raises(
    ValueError, match=r"leaf 'globals' has shape \(1, 5, 1\); expected leading size 2"
  ):
    BatchSpec.from_batch(ragged, mask_fn=graph_mask)


def test_a_mask_fn_that_does_not_give_rows_raises():
  graphs = random_graphs(4, seed=5)
  batch = stacked(padded_graph_batches(graphs), 1)[0]
  step = lambda w, g: pe.metrics.Mean().batch_updates(values=g.nodes[..., 0])
  flat_mask = lambda g: jraph.get_graph_padding_mask(jax.tree.map(lambda x: x[0], g))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
  with pytest.raises(
    ValueError, match=r"mask_fn\(batch 0\) returned shape \(5,\) and dtype bool; "
  ):
    pe.masked_eval(step, None, [batch], backend="jit", mesh=mesh, mask_fn=flat_mask)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"mask_fn": "keep"}, r"mask_fn must be a function"),
    ({"mask_fn": dict_mask, "outputs": True}, r"mask_fn cannot be combined with outputs=True"),
    (
      {"mask_fn": dict_mask, "checkpoint_dir": "/tmp/x"},
      r"mask_fn cannot be combined with checkpoint",
    ),
  ],
)
def test_mask_fn_refuses_what_it_does_not_support(kwargs, match):
  step = lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"], mask=b["keep"])
  with pytest.raises(ValueError, match=match):
    pe.masked_eval(step, None, [{"x": np.zeros(8), "keep": np.ones(8, bool)}], **kwargs)


def test_mask_fn_is_refused_with_several_processes(monkeypatch):
  """The multi-host lockstep's all-padding batches need a mask key: refused on every process alike."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  step = lambda p, b: pe.metrics.Mean().batch_updates(values=b[0], mask=b[1])
  with pytest.raises(ValueError, match=r"mask_fn cannot be combined with 2 processes"):
    pe.masked_eval(step, None, [(np.zeros(8), np.ones(8, bool))], mask_fn=lambda b: b[1])


def test_a_graph_without_mask_fn_is_refused_with_the_fix():
  graphs = random_graphs(3, seed=6)
  batch = stacked(padded_graph_batches(graphs), jax.local_device_count())[0]
  step = lambda w, g: pe.metrics.Mean().batch_updates(values=g.nodes[..., 0])
  with pytest.raises(ValueError, match=r"^batch 0 is a GraphsTuple; expected a dict .* mask_fn="):
    pe.masked_eval(step, WEIGHTS, [batch])
