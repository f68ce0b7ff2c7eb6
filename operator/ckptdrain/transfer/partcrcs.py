"""The parts' CRC32Cs a drain knows, written into the manifest it commits.

A reader that needs a range of a large file verifies the parts the range
covers against these instead of reading the whole file. A file gets them
when it is one part (its CRC32C is the part's), or when the journal knows
every part's CRC32C and they combine to the file's own CRC32C (always, for a
file sent in this drain; not for one a journal from before they were kept
marked complete): a list that does not
combine to the file's checksum would let a reader accept bytes the file's
checksum refuses, so it is left out, and readers fall back to whole files.
"""

from __future__ import annotations

import dataclasses
import logging

from ckptdrain import checksum
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.transfer.journal import UploadJournal

log = logging.getLogger(__name__)


def combined(entry: FileEntry, part_crcs: list[int]) -> int:
    """The file CRC32C that `part_crcs` (one per part of `entry`) make together."""
    crc = 0
    for part_crc, (_, length) in zip(part_crcs, entry.part_spans(), strict=True):
        crc = checksum.combine(crc, part_crc, length)
    return crc


def agrees(entry: FileEntry) -> bool:
    """Whether `entry`'s part CRC32Cs (it has some) combine to its file CRC32C."""
    assert entry.part_crc32c is not None
    crcs = [checksum.from_hex(c) for c in entry.part_crc32c]
    if len(crcs) == 1:
        return crcs[0] == checksum.from_hex(entry.crc32c)
    return checksum.to_hex(combined(entry, crcs)) == entry.crc32c


def with_part_crcs(manifest: WriterManifest, journal: UploadJournal) -> WriterManifest:
    """`manifest` with each file's part CRC32Cs where the journal has them all."""
    files = []
    for entry in manifest.files:
        state = journal.files.get(entry.path)
        crcs = state.part_crcs if state is not None and state.complete else None
        if crcs is None and entry.part_size is not None and len(entry.part_spans()) == 1:
            # One part (sent whole): its CRC32C is the file's, journaled or not.
            crcs = [checksum.from_hex(entry.crc32c)]
        if crcs is not None and entry.part_size is not None:
            candidate = (dataclasses.replace(
                entry, part_crc32c=tuple(checksum.to_hex(c) for c in crcs))
                if len(crcs) == len(entry.part_spans()) else None)
            if candidate is not None and agrees(candidate):
                entry = candidate
            else:
                log.warning("%s: the journal's %d part CRC32Cs do not make its CRC32C %s; "
                            "committing it without them (readers verify the whole file)",
                            entry.path, len(crcs), entry.crc32c)
        files.append(entry)
    return dataclasses.replace(manifest, files=tuple(files))
