"""The embedded store's group commit; the committer itself is backend-neutral
(:mod:`gpuscope.store.group`), shared with the remote backend's writes."""

from gpuscope.store.group import GroupCommitter, WriterClosed

__all__ = ["GroupCommitter", "WriterClosed"]
