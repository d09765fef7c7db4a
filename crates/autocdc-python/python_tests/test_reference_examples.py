"""The reference pages' Python examples, written with this module, give the
rows the pages describe (run by tests/python.rs).

Each test follows one example of `auto-cdc-apis` / `auto-cdc-advanced-topics`:
the same source rows, the same `create_auto_cdc_flow` /
`create_auto_cdc_from_snapshot_flow` arguments (strings where the pages pass
`col(...)` / `expr(...)`), and the target the page describes after each run.
"""

import datetime as dt
import json
import os
import tempfile
import unittest

import datafusion
import pyarrow as pa
import pyarrow.csv as pacsv

import datafusion_autocdc as cdc

USERS_CDF = [
    # Initial load.
    (124, "Raul", "Oaxaca", "INSERT", 1),
    (123, "Isabel", "Monterrey", "INSERT", 1),
    # New users.
    (125, "Mercedes", "Tijuana", "INSERT", 2),
    (126, "Lily", "Cancun", "INSERT", 2),
    # Isabel is removed from the system and Mercedes moved to Guadalajara.
    (123, None, None, "DELETE", 6),
    (125, "Mercedes", "Guadalajara", "UPDATE", 6),
    # This batch of updates arrived out of order.
    (125, "Mercedes", "Mexicali", "UPDATE", 5),
    (123, "Isabel", "Chihuahua", "UPDATE", 5),
]
TRUNCATE_AT_3 = (None, None, None, "TRUNCATE", 3)


def users_cdf(rows) -> pa.Table:
    schema = pa.schema(
        [
            ("userId", pa.int32()),
            ("name", pa.string()),
            ("city", pa.string()),
            ("operation", pa.string()),
            ("sequenceNum", pa.int32()),
        ]
    )
    return pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)


class ReferenceExamples(unittest.TestCase):
    def setUp(self) -> None:
        self.folder = tempfile.mkdtemp()
        self.s = cdc.CdcSession(os.path.join(self.folder, "warehouse"))

    def rows(self, query: str) -> list:
        return [tuple(r.values()) for r in pa.table(self.s.sql(query)).to_pylist()]

    def scd1_users(self, rows) -> None:
        self.s.register("users", users_cdf(rows))
        self.s.create_streaming_table("users_current")
        self.s.create_auto_cdc_flow(
            target="users_current",
            source="users",
            keys=["userId"],
            sequence_by="sequenceNum",
            apply_as_deletes="operation = 'DELETE'",
            apply_as_truncates="operation = 'TRUNCATE'",
            except_column_list=["operation", "sequenceNum"],
            stored_as_scd_type=1,
        )

    def test_scd_type_1(self) -> None:
        self.scd1_users(USERS_CDF)
        # 123 deleted; 125 shows only Guadalajara (the update at 5 came late)
        self.assertEqual(
            self.rows('SELECT * FROM users_current ORDER BY "userId"'),
            [
                (124, "Raul", "Oaxaca"),
                (125, "Mercedes", "Guadalajara"),
                (126, "Lily", "Cancun"),
            ],
        )

    def test_scd_type_1_with_the_truncate(self) -> None:
        self.scd1_users(USERS_CDF + [TRUNCATE_AT_3])
        # the table is cleared at 3: 124 and 126 are gone
        self.assertEqual(
            self.rows("SELECT * FROM users_current"), [(125, "Mercedes", "Guadalajara")]
        )

    def scd2_users(self, **options) -> None:
        self.s.register("users", users_cdf(USERS_CDF))
        self.s.create_streaming_table("users_history")
        self.s.create_auto_cdc_flow(
            target="users_history",
            source="users",
            keys=["userId"],
            sequence_by="sequenceNum",
            apply_as_deletes="operation = 'DELETE'",
            except_column_list=["operation", "sequenceNum"],
            stored_as_scd_type="2",
            **options,
        )

    def test_scd_type_2(self) -> None:
        self.scd2_users()
        # 123: two versions ended at 6 by the delete; 125: three versions
        self.assertEqual(
            self.rows('SELECT * FROM users_history ORDER BY "userId", __START_AT'),
            [
                (123, "Isabel", "Monterrey", 1, 5),
                (123, "Isabel", "Chihuahua", 5, 6),
                (124, "Raul", "Oaxaca", 1, None),
                (125, "Mercedes", "Tijuana", 2, 5),
                (125, "Mercedes", "Mexicali", 5, 6),
                (125, "Mercedes", "Guadalajara", 6, None),
                (126, "Lily", "Cancun", 2, None),
            ],
        )

    def test_scd_type_2_tracking_a_subset_of_columns(self) -> None:
        self.scd2_users(track_history_except_column_list=["city"])
        # city changes overwrite the current row instead of opening a version
        self.assertEqual(
            self.rows('SELECT * FROM users_history ORDER BY "userId", __START_AT'),
            [
                (123, "Isabel", "Chihuahua", 1, 6),
                (124, "Raul", "Oaxaca", 1, None),
                (125, "Mercedes", "Guadalajara", 2, None),
                (126, "Lily", "Cancun", 2, None),
            ],
        )

    def snapshot_table(self, rows) -> pa.Table:
        return pa.table(
            {"userId": pa.array([r[0] for r in rows], pa.int32()), "city": [r[1] for r in rows]}
        )

    def test_snapshots_by_pipeline_ingestion_time(self) -> None:
        for scd_type, target in [(2, "target"), (1, "target_scd1")]:
            self.s.register(
                "source", self.snapshot_table([(1, "Oaxaca"), (2, "Monterrey"), (3, "Tijuana")])
            )
            self.s.create_streaming_table(target)
            self.s.create_auto_cdc_from_snapshot_flow(
                target=target, source="source", keys=["userId"], stored_as_scd_type=scd_type
            )
        # after the first run every record is an active row
        self.assertEqual(
            self.rows('SELECT "userId", city, __END_AT FROM target ORDER BY "userId"'),
            [(1, "Oaxaca", None), (2, "Monterrey", None), (3, "Tijuana", None)],
        )
        self.s.register(
            "source",
            self.snapshot_table(
                [(2, "Carmel"), (3, "Los Angeles"), (4, "Death Valley"), (6, "Kings Canyon")]
            ),
        )
        self.s.refresh("target")
        self.s.refresh("target_scd1")
        # 1 ended (deleted); 2 and 3 have two versions; 4 and 6 are new
        self.assertEqual(
            self.rows(
                'SELECT "userId", city, __END_AT IS NULL AS current FROM target '
                'ORDER BY "userId", __START_AT'
            ),
            [
                (1, "Oaxaca", False),
                (2, "Monterrey", False),
                (2, "Carmel", True),
                (3, "Tijuana", False),
                (3, "Los Angeles", True),
                (4, "Death Valley", True),
                (6, "Kings Canyon", True),
            ],
        )
        # the versions of one run share their __START_AT; an ended version
        # ends where the next run began
        self.assertEqual(
            self.rows(
                "SELECT count(DISTINCT __START_AT) AS starts, "
                "count(DISTINCT __END_AT) AS ends FROM target"
            ),
            [(2, 1)],
        )
        # SCD type 1 shows only the current state
        self.assertEqual(
            self.rows('SELECT * FROM target_scd1 ORDER BY "userId"'),
            [(2, "Carmel"), (3, "Los Angeles"), (4, "Death Valley"), (6, "Kings Canyon")],
        )

    def test_snapshots_by_version_function(self) -> None:
        snapshot_dir = os.path.join(self.folder, "snapshots")
        os.makedirs(snapshot_dir)

        def write_snapshot(version: int, rows) -> None:
            pacsv.write_csv(
                self.snapshot_table(rows),
                os.path.join(snapshot_dir, f"snapshot_{version}.csv"),
            )

        # the page's function, with the folder listed by os instead of dbutils
        def next_snapshot_and_version(latest_snapshot_version):
            snapshot_files = [
                f for f in os.listdir(snapshot_dir)
                if f.startswith("snapshot_") and f.endswith(".csv")
            ]
            snapshot_versions = []
            for filename in snapshot_files:
                try:
                    snapshot_versions.append(
                        int(filename.replace("snapshot_", "").replace(".csv", ""))
                    )
                except ValueError:
                    continue
            snapshot_versions.sort()
            if latest_snapshot_version is None:
                if not snapshot_versions:
                    return None
                next_version = snapshot_versions[0]
            else:
                next_versions = [v for v in snapshot_versions if v > latest_snapshot_version]
                if not next_versions:
                    return None
                next_version = next_versions[0]
            path = os.path.join(snapshot_dir, f"snapshot_{next_version}.csv")
            return (pacsv.read_csv(path), next_version)

        write_snapshot(1, [(1, "Oaxaca"), (2, "Monterrey"), (3, "Tijuana")])
        self.s.create_streaming_table("target_versioned")
        runs = self.s.create_auto_cdc_from_snapshot_flow(
            target="target_versioned",
            source=next_snapshot_and_version,
            keys=["userId"],
            stored_as_scd_type=2,
        )
        self.assertEqual(len(runs), 1)
        history = 'SELECT "userId", city, __START_AT, __END_AT FROM target_versioned ORDER BY "userId", __START_AT'
        self.assertEqual(
            self.rows(history),
            [(1, "Oaxaca", 1, None), (2, "Monterrey", 1, None), (3, "Tijuana", 1, None)],
        )
        write_snapshot(2, [(2, "Carmel"), (3, "Los Angeles"), (4, "Death Valley"), (6, "Kings Canyon")])
        self.s.refresh("target_versioned")
        self.assertEqual(
            self.rows(history),
            [
                (1, "Oaxaca", 1, 2),
                (2, "Monterrey", 1, 2),
                (2, "Carmel", 2, None),
                (3, "Tijuana", 1, 2),
                (3, "Los Angeles", 2, None),
                (4, "Death Valley", 2, None),
                (6, "Kings Canyon", 2, None),
            ],
        )
        # several new snapshots are processed in order; none: nothing happens
        write_snapshot(3, [(2, "Carmel")])
        write_snapshot(4, [(2, "Monterrey")])
        self.assertEqual(len(self.s.refresh("target_versioned")), 2)
        self.assertEqual(
            self.rows('SELECT "userId", city FROM target_versioned WHERE __END_AT IS NULL'),
            [(2, "Monterrey")],
        )
        self.assertEqual(self.s.refresh("target_versioned")[0]["num_input_rows"], 0)

    def test_partial_updates_with_columns_to_update(self) -> None:
        self.s.register(
            "cdc_source",
            pa.table(
                {
                    "id": pa.array([1, 1, 1, 1, 2], pa.int32()),
                    "a": ["a1", "a2", None, "zz", "n"],
                    "b": pa.array([1, 2, 3, 9, 5], pa.int32()),
                    "columnsToUpdate": [None, ["b"], ["a"], [], ["b"]],
                    "sequenceNum": pa.array([10, 20, 30, 40, 10], pa.int32()),
                }
            ),
        )
        self.s.create_streaming_table("target")
        self.s.create_auto_cdc_flow(
            target="target",
            source="cdc_source",
            keys=["id"],
            sequence_by="sequenceNum",
            stored_as_scd_type=1,
            columns_to_update="columnsToUpdate",
        )
        # listed columns are written, explicit NULL included; the others keep
        # their value (NULL for a new key); an empty list writes none. The
        # page keeps sequenceNum in the target, and it is a column like the
        # others: written only by the event at 10, whose list is NULL (all)
        self.assertEqual(
            self.rows("SELECT * FROM target ORDER BY id"),
            [(1, None, 2, 10), (2, None, 5, None)],
        )

    def test_bitemporal_example(self) -> None:
        self.s.register(
            "cdc_source",
            pa.table(
                {
                    "id": pa.array([1, 1], pa.int32()),
                    "x": ["x10", "x20"],
                    "y": ["y10", "y20"],
                    "bt": pa.array([10, 20], pa.int32()),
                    "st": pa.array([100, 200], pa.int32()),
                }
            ),
        )
        self.s.create_streaming_table(name="target_bitemporal")
        self.s.create_auto_cdc_flow(
            target="target_bitemporal",
            source="cdc_source",
            keys=["id"],
            sequence_by="bt",
            system_sequence_by="st",
            stored_as_scd_type="bitemporal",
        )
        self.assertEqual(
            self.rows(
                "SELECT x, y, __START_AT, __END_AT, __SYSTEM_START_AT, __SYSTEM_END_AT "
                "FROM target_bitemporal ORDER BY __START_AT, __SYSTEM_START_AT"
            ),
            [
                ("x10", "y10", 10, None, 100, 200),
                ("x10", "y10", 10, 20, 200, None),
                ("x20", "y20", 20, None, 200, None),
            ],
        )

    def test_bitemporal_example_with_its_once_append_flow(self) -> None:
        """The page's Python example as written: the source is a streaming
        table filled once by `@dp.append_flow(target="cdc_source", once=True)`
        (here `create_append_flow(..., once=True)` over the same rows)."""
        self.s.create_streaming_table(name="cdc_source")
        self.s.register(
            "load_cdc_source",
            pa.table(
                {
                    "id": pa.array([1, 1], pa.int32()),
                    "x": ["x10", "x20"],
                    "y": ["y10", "y20"],
                    "bt": pa.array([10, 20], pa.int32()),
                    "st": pa.array([100, 200], pa.int32()),
                }
            ),
        )
        appended = self.s.create_append_flow(
            target="cdc_source", source="load_cdc_source", once=True
        )
        self.assertEqual(appended["num_upserted_rows"], 2)
        self.s.create_streaming_table(name="target_bitemporal")
        self.s.create_auto_cdc_flow(
            target="target_bitemporal",
            source="cdc_source",
            keys=["id"],
            sequence_by="bt",
            system_sequence_by="st",
            stored_as_scd_type="bitemporal",
        )
        self.assertEqual(
            self.rows(
                "SELECT x, y, __START_AT, __END_AT, __SYSTEM_START_AT, __SYSTEM_END_AT "
                "FROM target_bitemporal ORDER BY __START_AT, __SYSTEM_START_AT"
            ),
            [
                ("x10", "y10", 10, None, 100, 200),
                ("x10", "y10", 10, 20, 200, None),
                ("x20", "y20", 20, None, 200, None),
            ],
        )
        # once: a refresh appends nothing again
        self.s.refresh("cdc_source")
        self.assertEqual(self.rows("SELECT count(*) FROM cdc_source"), [(2,)])

    def test_expectations(self) -> None:
        """`expect_all` / `expect_all_or_drop` / `expect_all_or_fail` of
        `create_streaming_table`: kept and counted, dropped, or failing."""
        self.s.register(
            "events",
            pa.table(
                {
                    "id": pa.array([1, -2, 3], pa.int32()),
                    "name": ["a", "b", None],
                    "seq": pa.array([1, 1, 1], pa.int32()),
                }
            ),
        )
        self.s.create_streaming_table(
            "checked",
            expect_all={"has_name": "name IS NOT NULL"},
            expect_all_or_drop={"valid_id": "id > 0"},
        )
        self.s.create_auto_cdc_flow(
            target="checked", source="events", keys=["id"], sequence_by="seq",
            column_list=["id", "name"],
        )
        self.assertEqual(self.rows("SELECT * FROM checked ORDER BY id"), [(1, "a"), (3, None)])
        (counts,) = self.rows("SELECT expectations FROM event_log('checked') WHERE flow = 'checked'")
        self.assertEqual(
            json.loads(counts[0]),
            [
                {"name": "has_name", "passed": 2, "failed": 1, "dropped": 0},
                {"name": "valid_id", "passed": 2, "failed": 1, "dropped": 1},
            ],
        )
        self.s.create_streaming_table("strict", expect_all_or_fail={"has_name": "name IS NOT NULL"})
        with self.assertRaisesRegex(Exception, "expectation 'has_name'.*FAIL UPDATE.*id=3"):
            self.s.create_auto_cdc_flow(
                target="strict", source="events", keys=["id"], sequence_by="seq",
                column_list=["id", "name"],
            )

    def test_once_snapshot_backfill(self) -> None:
        """`once=True` on a snapshot flow: a backfill, run again only by a
        full refresh, while the change flow keeps processing."""
        self.s.register("backfill", pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["b1", "b2"]}))
        self.s.register(
            "feed",
            pa.table({"id": pa.array([2], pa.int32()), "v": ["f2"], "seq": pa.array([5], pa.int64())}),
        )
        self.s.create_streaming_table("hydrated")
        runs = self.s.create_auto_cdc_from_snapshot_flow(
            target="hydrated",
            source=lambda latest: None
            if latest is not None
            else (pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["b1", "b2"]}), 0),
            keys=["id"],
            once=True,
        )
        self.assertEqual(len(runs), 1)
        self.s.create_auto_cdc_flow(
            target="hydrated", source="feed", keys=["id"], sequence_by="seq", name="changes",
            except_column_list=["seq"],
        )
        self.assertEqual(self.rows("SELECT * FROM hydrated ORDER BY id"), [(1, "b1"), (2, "f2")])
        refreshed = self.s.refresh("hydrated")
        self.assertEqual([r["flow"] for r in refreshed], ["changes"])

    def test_bitemporal_worked_changes(self) -> None:
        """Company A's four changes, one run each, with the table after each."""

        def t(hms: str) -> dt.datetime:
            return dt.datetime.fromisoformat(f"2025-07-18T{hms}")

        def change(data, bt, st, op) -> pa.Table:
            return pa.table(
                {
                    "companyId": ["A"],
                    "data": pa.array([data], pa.string()),
                    "bt": pa.array([t(bt)], pa.timestamp("us")),
                    "st": pa.array([t(st)], pa.timestamp("us")),
                    "operation": [op],
                }
            )

        self.s.create_streaming_table("companies")
        changes = [
            change("XFv1", "10:01:00", "10:05:00", "INSERT"),
            change("XFv2", "12:15:43", "12:20:00", "UPDATE"),
            change("XFv3", "12:05:00", "12:25:00", "UPDATE"),
            change(None, "12:30:00", "12:30:00", "DELETE"),
        ]
        expected = [
            [("XFv1", "10:01:00", None, "10:05:00", None)],
            [
                ("XFv1", "10:01:00", None, "10:05:00", "12:20:00"),
                ("XFv1", "10:01:00", "12:15:43", "12:20:00", None),
                ("XFv2", "12:15:43", None, "12:20:00", None),
            ],
            [
                ("XFv1", "10:01:00", None, "10:05:00", "12:20:00"),
                ("XFv1", "10:01:00", "12:15:43", "12:20:00", "12:25:00"),
                ("XFv1", "10:01:00", "12:05:00", "12:25:00", None),
                ("XFv3", "12:05:00", "12:15:43", "12:25:00", None),
                ("XFv2", "12:15:43", None, "12:20:00", None),
            ],
            [
                ("XFv1", "10:01:00", None, "10:05:00", "12:20:00"),
                ("XFv1", "10:01:00", "12:15:43", "12:20:00", "12:25:00"),
                ("XFv1", "10:01:00", "12:05:00", "12:25:00", None),
                ("XFv3", "12:05:00", "12:15:43", "12:25:00", None),
                ("XFv2", "12:15:43", None, "12:20:00", "12:30:00"),
                ("XFv2", "12:15:43", "12:30:00", "12:30:00", None),
            ],
        ]
        for step, (rows, table) in enumerate(zip(changes, expected)):
            self.s.register("changes", rows)
            if step == 0:
                self.s.create_auto_cdc_flow(
                    target="companies", source="changes", keys=["companyId"],
                    sequence_by="bt", system_sequence_by="st",
                    apply_as_deletes="operation = 'DELETE'",
                    except_column_list=["bt", "st", "operation"],
                    stored_as_scd_type="BITEMPORAL",
                )
            else:
                self.s.refresh("companies")
            got = self.rows(
                "SELECT data, __START_AT, __END_AT, __SYSTEM_START_AT, __SYSTEM_END_AT "
                "FROM companies ORDER BY __START_AT, __SYSTEM_START_AT"
            )
            want = [
                (d, t(s), e and t(e), t(ss), se and t(se)) for (d, s, e, ss, se) in table
            ]
            self.assertEqual(got, want, f"after change {step + 1}")


class TableFunctionsInDataFusion(unittest.TestCase):
    """`table_changes`, `table_as_of` and `event_log` registered in a plain
    `datafusion.SessionContext` return what `s.sql` returns."""

    def test_the_functions_answer_as_in_the_session(self) -> None:
        s = cdc.CdcSession(os.path.join(tempfile.mkdtemp(), "warehouse"))
        s.register("users", users_cdf(USERS_CDF[:4]))
        s.create_streaming_table("users_current")
        flow = dict(
            target="users_current", source="users", keys=["userId"],
            sequence_by="sequenceNum", apply_as_deletes="operation = 'DELETE'",
            except_column_list=["operation", "sequenceNum"],
        )
        s.create_auto_cdc_flow(**flow)
        s.register("users", users_cdf(USERS_CDF[4:]))
        s.refresh("users_current")

        ctx = datafusion.SessionContext()
        for name in ["table_changes", "table_as_of", "event_log"]:
            function = s.table_function(name)
            self.assertEqual(function.name, name)
            ctx.register_udtf(datafusion.udtf(function, name))
        for query in [
            "SELECT \"userId\", city, _change_type, _commit_version "
            "FROM table_changes('users_current', 1) "
            "ORDER BY _commit_version, \"userId\", _change_type",
            "SELECT \"userId\", city FROM table_changes('users_current', 2, 2) "
            "WHERE _change_type = 'update_postimage' ORDER BY \"userId\"",
            "SELECT * FROM table_as_of('users_current', 1) ORDER BY \"userId\"",
            "SELECT count(*) AS n FROM table_as_of('users_current', 2)",
            "SELECT commit_version, operation, flow, num_upserted_rows "
            "FROM event_log('users_current') ORDER BY commit_version",
        ]:
            theirs = ctx.sql(query).to_arrow_table().to_pylist()
            self.assertEqual(theirs, pa.table(s.sql(query)).to_pylist(), query)
            self.assertTrue(theirs, query)
        # joined with the foreign session's own tables
        ctx.from_pydict({"userId": [125], "note": ["moved"]}, name="notes")
        self.assertEqual(
            ctx.sql(
                "SELECT n.note, c.city FROM notes n JOIN table_as_of('users_current', 2) c "
                "ON n.\"userId\" = c.\"userId\""
            ).to_arrow_table().to_pylist(),
            [{"note": "moved", "city": "Guadalajara"}],
        )
        with self.assertRaisesRegex(Exception, "versions are 0 to 2"):
            ctx.sql("SELECT * FROM table_as_of('users_current', 9)").collect()
        with self.assertRaisesRegex(ValueError, "no table function"):
            s.table_function("nope")


if __name__ == "__main__":
    unittest.main()
