"""Deduplication: exact documents, MinHash near duplicates and boilerplate lines, as sharded passes.

:mod:`~marin.curation.dedup.minhash` holds the signatures and LSH arithmetic;
:mod:`~marin.curation.dedup.keyed` groups documents by keys through sorted runs on scratch
(:mod:`~marin.curation.dedup.spill`, :mod:`~marin.curation.dedup.doc_table`), so a worker's memory
is set by :class:`~marin.curation.dedup.spill.SpillSettings`, not by its shard;
:mod:`~marin.curation.dedup.buckets` and :mod:`~marin.curation.dedup.components` find near
duplicates, :mod:`~marin.curation.dedup.lines` boilerplate lines, :mod:`~marin.curation.dedup.passes`
ties the passes together and :mod:`~marin.curation.dedup.join` joins decisions back onto documents.
The cached steps are in :mod:`marin.curation.dedup_steps`.
"""
