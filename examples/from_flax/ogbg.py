"""Flax's ogbg_molpcba example (linen, one-device jit, jraph GraphsTuples) converted to padded_eval.

Today's eval: ``input_pipeline.get_datasets`` packs each split with ``jraph.dynamically_batch`` into
GraphsTuples padded to fixed budgets (nodes, edges and graphs, estimated from the mean graph size
of 100 training graphs; one graph of every batch is padding), read back through
``tf.data.Dataset.from_generator``. ``evaluate_step`` (``jax.jit``) takes the labels from
``globals``, replaces ``globals`` by ones, runs the model, and builds ``get_valid_mask``: labels
not NaN and the graph not padding. The loss (masked binary cross entropy) and the accuracy are
clu ``Average``s (masked sums and counts, exact), and the mean average precision is a clu
``CollectingMetric``: ``evaluate_model`` merges every batch's logits, labels and mask on the
host, and ``compute`` runs scikit-learn's average precision per task over the tasks with both a
positive and a negative valid label (OGB's rule), then averages. Its numbers are exact; its cost
is every logit of the split copied to the host and a Python loop over the tasks at the end.

The conversion keeps the pipeline and the model: the padded GraphsTuples are stacked on a new
leading axis (one per row; here one row, one device, like the example), ``masked_eval`` takes
``mask_fn=jax.vmap(jraph.get_graph_padding_mask)``, and the metrics are masked sufficient
statistics: ``Mean`` for the loss and the accuracy, and ``AUPRC(task="multilabel",
num_classes=128, average="ogb", from_logits=True, exact=True, capacity=CAPACITY)``, which keeps
every valid logit on the device and computes OGB's mean AP exactly (to float32 rounding) once, at
the end. Without ``exact=True`` it is a histogram per task (4_097 bins, 8 MiB) within
``error_bound()`` of the exact value; ``tests/test_flax_ogbg.py`` checks both.
"""

import jax
import jax.numpy as jnp
import jraph
import numpy as np
from flax import linen as nn
from sklearn import metrics as skm

import padded_eval as pe
from examples.from_flax import common

BATCH_SIZE = 32  # graphs per padded GraphsTuple, one of them padding (the example's config: 256)
NUM_TASKS = 128  # ogbg-molpcba's binary tasks
NODE_FEATURES, EDGE_FEATURES, LATENT = 9, 3, 16
CAPACITY = 1024  # AUPRC(exact=True) keeps every valid logit: >= the split's 1003 graphs per task
# (a step costs O(tasks * capacity): size it to the split, 2**16 for molpcba's 43,793)
NO_POSITIVE, NO_NEGATIVE, UNLABELLED = range(0, 4), range(4, 7), range(7, 9)  # single-class tasks


class TinyGraphNet(nn.Module):
  """A stand-in for ``GraphNet``: embed nodes, one round of summed messages, the mean over
  each graph's nodes, one logit per task in ``globals``."""

  @nn.compact
  def __call__(self, graphs: jraph.GraphsTuple) -> jraph.GraphsTuple:
    hidden = nn.relu(nn.Dense(LATENT)(graphs.nodes))
    messages = nn.Dense(LATENT)(jnp.concatenate([hidden[graphs.senders], graphs.edges], -1))
    num_nodes, num_graphs = graphs.nodes.shape[0], graphs.n_node.shape[0]
    hidden = nn.relu(hidden + jax.ops.segment_sum(messages, graphs.receivers, num_nodes))
    graph_of_node = jnp.repeat(jnp.arange(num_graphs), graphs.n_node, total_repeat_length=num_nodes)
    pooled = jax.ops.segment_sum(hidden, graph_of_node, num_graphs)
    pooled = pooled / jnp.maximum(graphs.n_node, 1)[:, None]  # the mean over each graph's nodes
    return graphs._replace(globals=nn.Dense(NUM_TASKS)(pooled))


MODEL = TinyGraphNet()


def random_molecule(rng: np.random.Generator) -> jraph.GraphsTuple:
  """One graph of 2 to 14 atoms (ring-ish bonds in both directions), labels in ``globals``:
  ``[1, NUM_TASKS]`` float32, 1.0 / 0.0, NaN where missing (about 60%, as in ogbg-molpcba)."""
  atoms = int(rng.integers(2, 15))
  bonds = np.stack([np.arange(atoms), (np.arange(atoms) + 1) % atoms], -1)[: max(atoms - 1, 1)]
  bonds = np.concatenate([bonds, bonds[:, ::-1]])
  rate = np.linspace(0.02, 0.3, NUM_TASKS)
  labels = (rng.random(NUM_TASKS) < rate).astype(np.float32)
  labels[NO_POSITIVE.start : NO_POSITIVE.stop] = 0.0
  labels[NO_NEGATIVE.start : NO_NEGATIVE.stop] = 1.0
  labels[rng.random(NUM_TASKS) < 0.6] = np.nan
  labels[UNLABELLED.start : UNLABELLED.stop] = np.nan
  return jraph.GraphsTuple(
    nodes=rng.normal(size=(atoms, NODE_FEATURES)).astype(np.float32),
    edges=rng.normal(size=(len(bonds), EDGE_FEATURES)).astype(np.float32),
    senders=bonds[:, 0].astype(np.int32),
    receivers=bonds[:, 1].astype(np.int32),
    n_node=np.array([atoms], np.int32),
    n_edge=np.array([len(bonds)], np.int32),
    globals=labels[None],
  )


def make_inputs(seed: int = 6) -> tuple[dict, list[jraph.GraphsTuple]]:
  """``(params, graphs)``: the model's params and 1003 single-graph GraphsTuples."""
  rng = np.random.default_rng(seed)
  graphs = [random_molecule(rng) for _ in range(common.NUM_ROWS)]
  params = jax.jit(MODEL.init)(jax.random.key(seed), replace_globals(graphs[0]))
  return params, graphs


def padding_budget(graphs, batch_size):
  """The example's budget: mean nodes / edges of 100 graphs times the batch, rounded up to 64."""
  sample = graphs[:100]
  nodes = np.mean([g.n_node[0] for g in sample]) * batch_size
  edges = np.mean([g.n_edge[0] for g in sample]) * batch_size
  return 64 * (1 + int(nodes // 64)), 64 * (1 + int(edges // 64)), batch_size


def replace_globals(graphs):
  """The model's input: ``globals`` replaced by a constant feature per graph."""
  return graphs._replace(globals=jnp.ones([graphs.n_node.shape[0], 1]))


def masked_bce(logits, labels, mask):
  """Per-element sigmoid cross entropy; labels are read only where ``mask`` (NaN elsewhere)."""
  labels = jnp.where(mask, labels, -1)
  return jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))


def valid_mask(labels, graphs):
  """Labels that are not NaN, of graphs that are not padding: ``[G, tasks]``."""
  return ~jnp.isnan(labels) & jraph.get_graph_padding_mask(graphs)[:, None]


def graph_batches(graphs, batch_size):
  """``get_datasets`` for one split: tf.data over ``dynamically_batch`` at fixed budgets."""
  import tensorflow as tf

  budget = padding_budget(graphs, batch_size)
  example = jraph.pad_with_graphs(graphs[0], *budget)
  spec = jax.tree.map(lambda leaf: tf.TensorSpec(leaf.shape, leaf.dtype), example)

  def batching():
    return jraph.dynamically_batch(iter(graphs), *budget)

  return tf.data.Dataset.from_generator(batching, output_signature=spec)


def ogb_mean_average_precision(logits, labels, mask):
  """The example's ``MeanAveragePrecision.compute`` on the host: float32 sigmoid probabilities,
  scikit-learn's AP per task with both classes among the valid labels, averaged."""
  logits = np.asarray(jax.nn.sigmoid(logits))
  precisions = []
  for task in range(labels.shape[1]):
    task_labels = labels[mask[:, task], task]
    if len(np.unique(task_labels)) == 2:
      precisions.append(skm.average_precision_score(task_labels, logits[mask[:, task], task]))
  return np.mean(precisions) if precisions else np.nan


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()


def original_get_batches(graphs, batch_size):
  """The example's eval split: padded GraphsTuples, as tf.data yields them."""
  return graph_batches(graphs, batch_size).as_numpy_iterator()


@jax.jit
@ORIGINAL_TRACES
def original_evaluate_step(params, graphs):
  """The example's step: masked sums for the averages, and every output for the mAP."""
  labels = graphs.globals
  logits = MODEL.apply(params, replace_globals(graphs)).globals
  mask = valid_mask(labels, graphs)
  loss = masked_bce(logits, labels, mask)
  hits = ((logits > 0) == labels).astype(jnp.float32)
  averages = {"loss": jnp.sum(jnp.where(mask, loss, 0)), "accuracy": jnp.sum(hits * mask)}
  return {"totals": averages, "count": jnp.sum(mask), "collected": (logits, labels, mask)}


def original_eval(params, graphs, batch_size=BATCH_SIZE):
  """The example's evaluate_model: merge every batch, compute once; returns (metrics, rows)."""
  merged, real_graphs = None, 0
  for batch in original_get_batches(graphs, batch_size):
    update = jax.device_get(original_evaluate_step(params, batch))
    real_graphs += int(np.sum(jraph.get_graph_padding_mask(batch)))  # for the report only
    if merged is None:
      merged = {**update, "collected": [update["collected"]]}
    else:
      merged["totals"] = {k: merged["totals"][k] + update["totals"][k] for k in update["totals"]}
      merged["count"] = merged["count"] + update["count"]
      merged["collected"].append(update["collected"])
  logits, labels, mask = (np.concatenate(parts) for parts in zip(*merged["collected"]))
  results = {key: total / merged["count"] for key, total in merged["totals"].items()}
  results["mean_average_precision"] = ogb_mean_average_precision(logits, labels, mask)
  return results, real_graphs


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()
METRICS = pe.Metrics(
  {
    "loss": pe.metrics.Mean("loss"),
    "accuracy": pe.metrics.Mean("hits"),
    "mean_average_precision": pe.metrics.AUPRC(
      task="multilabel",
      num_classes=NUM_TASKS,
      average="ogb",
      from_logits=True,
      exact=True,
      capacity=CAPACITY,
    ).map_arg(preds="logits", target="labels"),
  }
)


REAL_GRAPHS = jax.vmap(jraph.get_graph_padding_mask)  # mask_fn: [rows, graphs]; one object, one
# compilation (masked_eval caches its compiled loop per step_fn and mask_fn)


def converted_get_batches(graphs, batch_size, rows=1):
  """The same padded GraphsTuples, ``rows`` of them stacked on a new leading axis."""
  budget = padding_budget(graphs, batch_size)
  no_graph = jax.tree.map(lambda leaf: leaf[:0], graphs[0])  # all padding once padded
  filler = jraph.pad_with_graphs(no_graph, *budget)
  group = []
  for batch in graph_batches(graphs, batch_size).as_numpy_iterator():
    group.append(batch)
    if len(group) == rows:
      yield jax.tree.map(lambda *leaves: np.stack(leaves), *group)
      group = []
  if group:
    group += [filler] * (rows - len(group))
    yield jax.tree.map(lambda *leaves: np.stack(leaves), *group)


@CONVERTED_TRACES
def converted_evaluate_step(params, graphs):
  """Masked statistics of stacked padded GraphsTuples (leaves ``[rows, ...]``)."""
  labels = graphs.globals
  logits = jax.vmap(lambda g: MODEL.apply(params, replace_globals(g)).globals)(graphs)
  mask = jax.vmap(valid_mask)(labels, graphs)
  loss = masked_bce(logits, labels, mask)
  hits = ((logits > 0) == labels).astype(jnp.float32)
  return METRICS.batch_updates(loss=loss, hits=hits, logits=logits, labels=labels, mask=mask)


def converted_eval(params, graphs, batch_size=BATCH_SIZE, backend="jit", rows=1):
  """Every graph, one compilation, metrics merged on the device; returns (metrics, rows).

  ``rows`` padded GraphsTuples per step: 1 on one device (``"jit"``, like the example), or a
  multiple of the device count to give each device its own (``"pmap"``, ``"shard_map"``)."""
  one_device = jax.sharding.Mesh(np.array(jax.devices()[:rows]), ("batch",))
  results = pe.masked_eval(
    converted_evaluate_step,
    params,
    converted_get_batches(graphs, batch_size, rows),
    backend=backend,
    mesh=one_device if backend == "jit" else None,
    mask_fn=REAL_GRAPHS,
  )
  return results, results.pop("num_examples")


# --- float64 reference -------------------------------------------------------------------------
def logits64(params: dict, graph: jraph.GraphsTuple) -> np.ndarray:
  """`TinyGraphNet` on one unbatched graph in numpy float64: ``[1, NUM_TASKS]`` logits."""
  layers = {
    name: (np.asarray(d["kernel"], np.float64), np.asarray(d["bias"], np.float64))
    for name, d in params["params"].items()
  }
  (embed, embed_bias), (message, message_bias), (head, head_bias) = (
    layers[f"Dense_{i}"] for i in range(3)
  )
  hidden = np.maximum(graph.nodes @ embed + embed_bias, 0)
  messages = np.concatenate([hidden[graph.senders], graph.edges], -1) @ message + message_bias
  summed = np.zeros_like(hidden)
  np.add.at(summed, graph.receivers, messages)
  hidden = np.maximum(hidden + summed, 0)
  return hidden.mean(0, keepdims=True) @ head + head_bias


def ogb_rule64(logits: np.ndarray, labels: np.ndarray) -> float:
  """OGB's ``Evaluator`` rule for ``"ap"``: mean of scikit-learn's AP over the tasks whose
  non-NaN labels hold both a 1 and a 0 (float64 scores; NaN when no task qualifies)."""
  precisions = []
  for task in range(labels.shape[1]):
    labelled = ~np.isnan(labels[:, task])
    if np.any(labels[labelled, task] == 1) and np.any(labels[labelled, task] == 0):
      scores = logits[labelled, task]
      precisions.append(skm.average_precision_score(labels[labelled, task], scores))
  return float(np.mean(precisions)) if precisions else float("nan")


def reference(params: dict, graphs: list[jraph.GraphsTuple]) -> tuple[dict[str, float], int]:
  """Loss, accuracy and OGB mean AP over every valid label of every graph, numpy float64.

  Args:
    params: the model's params.
    graphs: the single-graph GraphsTuples of `make_inputs`.

  Returns:
    ``({"loss", "accuracy", "mean_average_precision"}, graphs)``.
  """
  logits = np.concatenate([logits64(params, g) for g in graphs])  # [graphs, tasks]
  labels = np.concatenate([g.globals for g in graphs]).astype(np.float64)
  valid = ~np.isnan(labels)
  loss = np.logaddexp(0, logits) - logits * np.nan_to_num(labels)
  hits = (logits > 0) == (labels == 1)
  metrics = {
    "loss": loss[valid].mean(),
    "accuracy": hits[valid].mean(),
    "mean_average_precision": ogb_rule64(logits, labels),
  }
  return metrics, len(graphs)


ORIGINAL = (original_get_batches, original_evaluate_step, original_eval)
CONVERTED = (converted_get_batches, converted_evaluate_step, converted_eval)
