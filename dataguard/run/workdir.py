"""The resume folder ``OUTPUT/_work``: every name in it, the resume fingerprint, unit results.

Layout (the only place these names are built)::

    _work/fingerprint                      what the work below was computed for
    _work/segNN/unit-NNNNNN.arrow          a unit's kept rows after segment NN
    _work/segNN/unit-NNNNNN.rejected.arrow the rows segment NN rejected from it (if any)
    _work/segNN/unit-NNNNNN.meta.json      counts, stats, fit summaries (by step), column marks,
                                           file facts
    _work/segNN/unit-NNNNNN.sSS.KIND.arrow step SS's fit material (a stage fitted in rounds)
    _work/fitSS/...                        the rounds of step SS's fit (`dataguard.rounds.tasks`)

A unit's Arrow files are fsynced before its meta file is renamed into place, so the meta
file is the completion marker: on resume a unit is skipped only if its meta decodes and
the files it names are there with the recorded size and sha256. Resume state is data
(``dataguard.io.state_codec``), never pickle: anyone who can write to the output folder
must not be able to run code in the next run. Fitted state is not stored: the driver
refits from the summaries in the metas (fits are deterministic), which is what keeps a
resumed run byte-identical to a fresh one without trusting pickled models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataguard import __version__
from dataguard.io import state_codec
from dataguard.io.readers import file_sha256
from dataguard.io.work_names import WORK
from dataguard.io.writer import atomic_write_bytes, read_table, write_table
from dataguard.records import REJECTED_SCHEMA, json_dumps

if TYPE_CHECKING:
    from dataguard.io.output import OutputFolder

# What a unit's meta holds and how stages are numbered in it. Part of the fingerprint, so
# work left by an engine that wrote metas differently is discarded instead of misread.
WORK_FORMAT = 6  # 6: stages may fit in rounds (unit fit files, fitSS/ folders); 5: shared boundaries
# Config keys that say where or how a run executes (or what trains on it later), not what
# it produces: they never change the manifest or the resume fingerprint.
RUNTIME_KEYS = ("workers", "executor", "ray_address", "report", "output", "train")


def without_runtime_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config minus the keys that only say where or how it runs."""
    return {k: v for k, v in config.items() if k not in RUNTIME_KEYS}


def fingerprint(config: Mapping[str, Any], inputs: Sequence[Mapping[str, Any]], batch_rows: int,
                stage_names: Sequence[str], split_bytes: int | None = None) -> str:
    """What the work in ``_work`` depends on: the config (runtime keys never count), the
    inputs' checksums, the unit size and input range size (unit boundaries), the stages,
    dataguard's version and the work format."""
    payload = json_dumps({"config": without_runtime_keys(config), "inputs": list(inputs), "version": __version__,
                          "batch_rows": batch_rows, "split_bytes": split_bytes, "stages": list(stage_names),
                          "work_format": WORK_FORMAT})
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class UnitFiles:
    """The files of one unit in one segment folder."""

    folder: Path
    unit: int

    @property
    def kept(self) -> Path:
        return self.folder / f"unit-{self.unit:06d}.arrow"

    @property
    def rejected(self) -> Path:
        return self.folder / f"unit-{self.unit:06d}.rejected.arrow"

    @property
    def meta(self) -> Path:
        return self.folder / f"unit-{self.unit:06d}.meta.json"

    def read_kept(self) -> pa.Table:
        return read_table(self.kept)

    def read_rejected(self) -> pa.Table:
        return read_table(self.rejected)

    def write(self, kept: pa.Table, rejected: Sequence[pa.Table], meta: dict[str, Any],
              extra: Sequence[Path] = ()) -> dict[str, Any]:
        """Write the unit's rows, then its meta (with the facts of these files and of the
        ``extra`` ones already written in this folder: fit material) as the completion
        marker. Returns the meta exactly as a resumed run reads it back, so a fresh run and
        a resumed one build the manifest from the same values."""
        self.folder.mkdir(parents=True, exist_ok=True)
        files = {}
        write_table(self.kept, kept)
        files[self.kept.name] = _file_fact(self.kept)
        if meta["rejected"]:
            write_table(self.rejected, pa.concat_tables([t.cast(REJECTED_SCHEMA) for t in rejected]))
            files[self.rejected.name] = _file_fact(self.rejected)
        for path in extra:
            files[path.name] = _file_fact(path)
        meta["files"] = files
        meta["schema"] = kept.schema.serialize().to_pybytes()
        encoded = state_codec.dumps(meta)
        atomic_write_bytes(self.meta, encoded)
        return state_codec.loads(encoded)

    def load_finished(self) -> dict[str, Any] | None:
        """The meta of this unit as a previous run finished it, or None if it must be redone.

        A meta file that does not decode, or names files that are missing or whose size or
        hash differ (a crash between writes, a disk that lost data, a hand edit), means the
        unit is redone rather than trusted.
        """
        path = self.meta
        if not path.is_file():
            return None
        try:
            meta = state_codec.loads(path.read_bytes())
            for name, fact in meta["files"].items():
                unit_file = self.folder / name
                if (Path(name).name != name or not unit_file.is_file()
                        or unit_file.stat().st_size != fact["bytes"] or file_sha256(unit_file) != fact["sha256"]):
                    return None
            if meta["unit"] != self.unit:
                return None
        except (state_codec.StateFormatError, KeyError, TypeError, AttributeError, OSError):
            return None
        return meta


def _file_fact(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


class WorkDir:
    """``OUTPUT/_work``: segment folders, unit files and the fingerprint marker."""

    def __init__(self, output: Path) -> None:
        self.root = Path(output) / WORK

    def segment(self, index: int) -> Path:
        return self.root / f"seg{index:02d}"

    def fit_folder(self, step: int) -> Path:
        """Where the rounds of step ``step``'s fit write (`dataguard.rounds`)."""
        return self.root / f"fit{step:02d}"

    def unit(self, segment: int, unit: int) -> UnitFiles:
        return UnitFiles(self.segment(segment), unit)

    def prepare(self, folder: OutputFolder, fingerprint: str, fresh: bool) -> bool:
        """Keep work of the same fingerprint (returns True: resume); otherwise clean what
        dataguard wrote in the output folder, only that, and start over."""
        marker = self.root / "fingerprint"
        if not fresh and marker.is_file() and _read_text(marker) == fingerprint:
            return True
        folder.clean()
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(marker, fingerprint.encode())
        return False


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
