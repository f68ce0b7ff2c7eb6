"""The policy's `storage.coldStorage` classes, which both sides read: the
operator validates them against the store's scheme, the agent refuses a
class its store cannot have. Pure."""

from __future__ import annotations

#: Colder classes that still serve reads directly, per store: S3's (GLACIER
#: and DEEP_ARCHIVE need a restore request first) and GCS's (all of which do).
COLD_CLASSES = {
    "s3://": ("STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR",
              "REDUCED_REDUNDANCY"),
    "gs://": ("NEARLINE", "COLDLINE", "ARCHIVE"),
}


def cold_class_expected(scheme: str | None = None) -> str:
    """What storage.coldStorage.storageClass may be, for a store's scheme or any."""
    schemes = [scheme] if scheme is not None and scheme in COLD_CLASSES else list(COLD_CLASSES)
    choices = "; ".join(f"{', '.join(COLD_CLASSES[s])} with an {s} storage.uri"
                        for s in schemes)
    return (f"{choices} (restore reads checkpoints directly; S3's GLACIER and "
            "DEEP_ARCHIVE need a restore request first)")


def cold_class_problem(uri: str, storage_class: str) -> str | None:
    """Why `storage_class` cannot be used with the store at `uri`, or None."""
    scheme = next((s for s in COLD_CLASSES if uri.startswith(s)), None)
    if scheme is None:
        return "unset, or an s3:// or gs:// storage.uri (a file:// store has no classes)"
    if storage_class not in COLD_CLASSES[scheme]:
        return cold_class_expected(scheme)
    return None
