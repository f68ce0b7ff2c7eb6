"""Requests by billing class (request_counts.py)."""

from __future__ import annotations

from ckptdrain.request_counts import RequestCounts


def test_operations_fall_into_their_billing_class_and_subtract() -> None:
    c = RequestCounts()
    for op in ("create_multipart_upload", "upload_part", "upload_part",
               "complete_multipart_upload", "put_object"):
        c = c.plus(op, up=10)
    start = c
    c = c.plus("head_object").plus("get_object", down=7).plus("list_objects_v2")
    c = c.plus("abort_multipart_upload").plus("delete_object").plus("list_parts")
    assert (start.put, start.bytes_up) == (5, 50)
    spent = c.minus(start)
    assert spent == RequestCounts(put=0, get=2, list=2, delete=2, bytes_up=0, bytes_down=7)
    assert spent.total == 6
    assert spent.as_record() == {"put": 0, "get": 2, "list": 2, "delete": 2,
                                 "bytesUp": 0, "bytesDown": 7}


def test_an_unknown_operation_counts_as_a_get() -> None:
    assert RequestCounts().plus("get_bucket_location").get == 1
