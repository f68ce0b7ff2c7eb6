"""What a checkpoint costs in requests: the S3 operations we send, by price class.

Pure. S3 bills requests by class, not by operation: PUT, COPY, POST and
LIST requests share one price, GET, HEAD and the rest another, DELETE and
abort are free. `RequestCounts` adds up what a process sent (every attempt,
retries included: each one is a request the store saw) and the bytes each
way, and subtracts, so that the cost of one checkpoint is the difference of
two snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

#: botocore operation name -> billing class. Unknown operations count as "get".
REQUEST_CLASS: dict[str, str] = {
    "put_object": "put",
    "upload_part": "put",
    "create_multipart_upload": "put",
    "complete_multipart_upload": "put",
    "copy_object": "put",
    "upload_part_copy": "put",
    "list_objects_v2": "list",
    "list_parts": "list",
    "list_multipart_uploads": "list",
    "get_object": "get",
    "head_object": "get",
    "delete_object": "delete",
    "abort_multipart_upload": "delete",
}


@dataclass(frozen=True)
class RequestCounts:
    put: int = 0
    get: int = 0
    list: int = 0
    delete: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    def plus(self, op: str, up: int = 0, down: int = 0) -> RequestCounts:
        """These counts with one more `op` request carrying `up` and `down` bytes."""
        cls = REQUEST_CLASS.get(op, "get")
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values[cls] += 1
        values["bytes_up"] += up
        values["bytes_down"] += down
        return RequestCounts(**values)

    def minus(self, earlier: RequestCounts) -> RequestCounts:
        """What was sent since `earlier` (a snapshot of the same counter)."""
        return RequestCounts(**{f.name: getattr(self, f.name) - getattr(earlier, f.name)
                                for f in fields(self)})

    def added(self, other: RequestCounts) -> RequestCounts:
        """The sum of two counts (of one checkpoint's attempts, say)."""
        return RequestCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                for f in fields(self)})

    @property
    def total(self) -> int:
        return self.put + self.get + self.list + self.delete

    def as_record(self) -> dict[str, int]:
        """The form a Checkpoint record's writer claim carries (camelCase)."""
        return {"put": self.put, "get": self.get, "list": self.list, "delete": self.delete,
                "bytesUp": self.bytes_up, "bytesDown": self.bytes_down}
