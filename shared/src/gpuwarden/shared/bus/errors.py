"""The bus's errors: messages the broker did not confirm, and a principal the broker refuses."""

from __future__ import annotations

__all__ = [
    "DeliveryError",
    "NotAuthorizedError",
    "not_authorized",
]


class NotAuthorizedError(RuntimeError):
    """The broker refuses this client's principal an operation (an ACL is missing, e.g. WRITE
    on a topic): not transient, so a consumer stops with this error instead of retrying."""


#: aiokafka errors that mean "this principal may not": retrying cannot help.
_NOT_AUTHORIZED = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "TransactionalIdAuthorizationFailed",
)


def not_authorized(exc: BaseException) -> BaseException | None:
    """The authorization error in ``exc`` (itself, or one of a :class:`DeliveryError`'s), else None."""
    causes = [e for _, e in exc.failed] if isinstance(exc, DeliveryError) else [exc]
    return next((e for e in causes if type(e).__name__ in _NOT_AUTHORIZED), None)


class DeliveryError(RuntimeError):
    """The broker did not confirm some published messages (unreachable, timed out, refused).

    ``failed``: ``(short topic, exception)`` per message that was not delivered."""

    def __init__(self, failed: list[tuple[str, BaseException]]) -> None:
        first = failed[0][1] if failed else None
        super().__init__(
            f"{len(failed)} message(s) not delivered"
            + (f", first on {failed[0][0]}: {type(first).__name__}: {first}" if first is not None else "")
        )
        self.failed = failed
