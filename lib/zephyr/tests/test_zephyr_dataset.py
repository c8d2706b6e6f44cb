import pytest

from zephyr import Dataset, current_worker_context
from zephyr.worker_context import NoWorkerContextError, WorkerContext


def collect(ds, **kwargs):
    return ds.collect(backend="inline", **kwargs)


def test_sources_shard_as_asked():
    ds = Dataset.from_list(range(10), num_shards=3)
    assert ds.num_source_shards == 3
    assert collect(ds) == list(range(10))
    assert collect(Dataset.from_iterable((x * x for x in range(4)), num_shards=2)) == [0, 1, 4, 9]


def test_element_wise_transforms():
    ds = (
        Dataset.from_list(range(12), num_shards=3)
        .map(lambda x: x + 1)
        .filter(lambda x: x % 2 == 0)
        .flat_map(lambda x: [x, -x])
    )
    assert collect(ds) == [v for x in range(1, 13) if x % 2 == 0 for v in (x, -x)]
    batched = Dataset.from_list(range(7), num_shards=2).map_shard(lambda it: [sum(it)])
    assert collect(batched) == [0 + 1 + 2 + 3, 4 + 5 + 6]
    assert collect(Dataset.from_list(range(10), num_shards=2).take_per_shard(2)) == [0, 1, 5, 6]


def test_element_wise_chain_fuses_into_one_streaming_pass():
    events = []

    def traced_map(x):
        events.append(("map", x))
        return x

    def traced_filter(x):
        events.append(("filter", x))
        return True

    ds = Dataset.from_list(range(3)).map(traced_map).filter(traced_filter).map_shard(lambda it: it)
    plan = ds.plan()
    assert len(plan) == 1 and plan[0].partition is None
    assert collect(ds) == [0, 1, 2]
    # One element travels the whole chain before the next is pulled: no intermediate lists.
    assert events == [("map", 0), ("filter", 0), ("map", 1), ("filter", 1), ("map", 2), ("filter", 2)]


def test_take_per_shard_stops_pulling_early():
    pulled = []

    def source_items():
        for i in range(1000):
            pulled.append(i)
            yield i

    ds = Dataset.from_shards([source_items]).map(lambda x: x * 2).take_per_shard(3)
    assert collect(ds) == [0, 2, 4]
    assert len(pulled) == 3


def test_reshard_changes_shard_count_and_keeps_every_element():
    ds = Dataset.from_list(range(20), num_shards=4).reshard(3)
    plan = ds.plan()
    assert [stage.num_shards for stage in plan] == [4, 3]
    out = collect(ds.map_shard(lambda it: [sorted(it)]))
    assert len(out) == 3
    assert sorted(x for shard in out for x in shard) == list(range(20))
    assert max(map(len, out)) - min(map(len, out)) <= 1


def test_group_by_and_deduplicate():
    words = ["b", "a", "b", "c", "a", "b"]
    counts = collect(Dataset.from_list(words, num_shards=3).group_by(lambda w: w, lambda k, items: (k, len(list(items)))))
    assert sorted(counts) == [("a", 2), ("b", 3), ("c", 1)]
    records = [{"id": i % 4, "v": i} for i in range(10)]
    unique = collect(Dataset.from_list(records, num_shards=2).deduplicate(key=lambda r: r["id"], num_shards=2))
    assert sorted(r["id"] for r in unique) == [0, 1, 2, 3]
    # The first occurrence (source order) is the one kept.
    assert sorted(r["v"] for r in unique) == [0, 1, 2, 3]
    plan = Dataset.from_list(words).deduplicate().plan()
    assert len(plan) == 2 and "deduplicate" not in plan[1].describe()


def test_worker_context_counters_and_shared_objects():
    def tag(x):
        context = current_worker_context()
        context.increment("seen")
        if x % 2:
            context.increment("odd")
        return (context.shard_index, context.num_shards, context.get_shared("prefix") + str(x))

    from zephyr.execute import execute
    from zephyr.sinks import CollectSink

    result = execute(Dataset.from_list(range(5), num_shards=2).map(tag), CollectSink(), backend="inline",
                     shared={"prefix": "n"})
    assert result.outputs == [[(0, 2, "n0"), (0, 2, "n1"), (0, 2, "n2")], [(1, 2, "n3"), (1, 2, "n4")]]
    assert result.counters == {"seen": 5, "odd": 2}
    with pytest.raises(NoWorkerContextError):
        current_worker_context()
    with pytest.raises(KeyError, match="no shared object 'missing'"):
        WorkerContext(0, 1).get_shared("missing")


def test_errors_in_user_functions_reach_the_caller():
    def boom(x):
        raise ValueError(f"bad element {x}")

    with pytest.raises(ValueError, match="bad element 0") as caught:
        collect(Dataset.from_list([0]).map(boom))
    assert "raised in shard 0 of stage 0" in "".join(caught.value.__notes__)


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError):
        Dataset.from_list([1]).reshard(0)
    with pytest.raises(ValueError):
        Dataset.from_list([1]).take_per_shard(-1)
    with pytest.raises(ValueError, match="Unknown zephyr backend 'gpu-cluster'"):
        Dataset.from_list([1]).collect(backend="gpu-cluster")

