"""Attention past one machine, on Dask: sequence-parallel attention and a KV cache sharded over workers.

Needs the optional extra ``attnlab[distributed]`` (``dask[distributed]``); Dask is imported only when a
function here runs, so ``import attnlab.distributed`` works without it.

- :func:`sequence_parallel_attention`: key/value shards on the workers, one task per visible (query block,
  key shard) pair, partials merged by log-sum-exp on the workers (Ring Attention's arithmetic).
- :class:`ShardedKVCache`: a long context's keys and values as shards held by the workers; a decode step
  sends q to every shard and merges the partials (Flash-Decoding across machines).
- :func:`get_client`: a Client, a scheduler address, or an embedded LocalCluster.
"""

from .cluster import close_embedded, connect, get_client, local_cluster, worker_stats
from .kvcache import ShardedKVCache, ShardLostError
from .partials import decode_part, merge_partials, merge_tree
from .sequence import sequence_parallel_attention

__all__ = ["ShardLostError", "ShardedKVCache", "close_embedded", "connect", "decode_part", "get_client",
           "local_cluster", "merge_partials", "merge_tree", "sequence_parallel_attention", "worker_stats"]
