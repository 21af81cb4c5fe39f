"""DynamoDB document repository: versioned organisational documents in the Tenants table.

``DOC#<kind>#<version:08d>`` items keep every version; ``DOC#<kind>#HEAD`` is a copy of the current
one. A new version is written in one transaction: the version item only if it does not exist, and
the head only if it still names the version the writer read, so two admins replacing the policy at
once cannot both win and no version is ever overwritten.
"""

from __future__ import annotations

from datetime import datetime

from pynamodb.connection import Connection
from pynamodb.transactions import TransactWrite

from berth.dal.errors import translated
from berth.dal.models import DocumentRow, document_model
from berth.domain.errors import Conflict
from berth.domain.fleet import StoredDocument

DOC = "DOC#"


def _head(kind: str) -> str:
    return f"{DOC}{kind}#HEAD"


def _version_key(kind: str, version: int) -> str:
    return f"{DOC}{kind}#{version:08d}"


class DynamoDocumentRepository:
    def __init__(self, table_name: str) -> None:
        self._Row = document_model(table_name)
        self._conn = Connection()

    @staticmethod
    def _doc(row: DocumentRow) -> StoredDocument:
        return StoredDocument(
            kind=str(row.kind),
            version=int(row.version or 0),
            document=row.document,
            updated_at=row.updated_at,
            updated_by=row.updated_by,
        )

    def _read(self, pk: str) -> StoredDocument | None:
        with translated("read document"):
            try:
                row = self._Row.get(pk, consistent_read=True)
            except self._Row.DoesNotExist:
                return None
        return None if row.version is None else self._doc(row)

    def current(self, kind: str) -> StoredDocument | None:
        return self._read(_head(kind))

    def version(self, kind: str, version: int) -> StoredDocument | None:
        if version < 1:
            return None
        return self._read(_version_key(kind, version))

    def put(
        self, kind: str, document: object, expected_version: int, at: datetime, by: str
    ) -> StoredDocument:
        R = self._Row
        new = expected_version + 1

        def row(pk: str) -> DocumentRow:
            return R(pk, kind=kind, version=new, document=document, updated_at=at, updated_by=by)

        head_condition = R.pk.does_not_exist() if expected_version == 0 else R.version == expected_version
        try:
            with translated(f"write {kind} version {new}"), TransactWrite(connection=self._conn) as tx:
                tx.save(row(_version_key(kind, new)), condition=R.pk.does_not_exist())
                tx.save(row(_head(kind)), condition=head_condition)
        except Conflict as exc:
            raise Conflict(
                f"the {kind} is no longer at version {expected_version}; read it again and retry",
                details={"expected_version": expected_version},
            ) from exc
        return StoredDocument(kind=kind, version=new, document=document, updated_at=at, updated_by=by)
