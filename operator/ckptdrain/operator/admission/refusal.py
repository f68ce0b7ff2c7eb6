"""How admission refuses: the exception its webhooks raise, with the HTTP
code the apiserver passes on, and what a read from the apiserver raises when
it gets no answer it can use (each caller decides what that refuses)."""

from __future__ import annotations

from ckptdrain.operator.apiserver import reads as apiserver_reads


class Refused(Exception):
    """An admission refused, with the HTTP code the apiserver passes on."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


#: What a read from the apiserver raises when it gets no answer it can use.
READ_ERRORS = (apiserver_reads.ApiError, apiserver_reads.HTTPError, OSError)


def named_namespace(namespace: str, kind: str) -> str:
    """`namespace`, the review's request.namespace for an object of a
    namespaced `kind`. Refused (400) when empty, a review no apiserver
    sends (forged, or hand-made): every read admission makes would
    otherwise go to a cluster-wide path (the namespaces' list, every
    namespace's policies) or fail as a bare error (a 500)."""
    if not namespace:
        raise Refused(f"request.namespace: expected the namespace of the {kind} "
                      f"(a namespaced kind), got an empty one", code=400)
    return namespace
