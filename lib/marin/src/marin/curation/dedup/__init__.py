"""Deduplication: exact documents and MinHash near duplicates, as sharded zephyr passes.

:mod:`~marin.curation.dedup.minhash` holds the signatures and LSH arithmetic,
:mod:`~marin.curation.dedup.passes` the zephyr pipelines, :mod:`~marin.curation.dedup.records` how
decisions are joined back onto documents. The cached steps are in :mod:`marin.curation.dedup_steps`.
"""
