"""The Python module against the reference pages' flows (run by tests/python.rs)."""

import os
import tempfile
import unittest
from datetime import datetime

import datafusion
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

import datafusion_autocdc as cdc


def users_cdf() -> pa.Table:
    """The quickstart's change feed (a delete of 123 at 6)."""
    return pa.table(
        {
            "userId": [124, 123, 125, 126, 123],
            "name": ["Raul", "Isabel", "Mercedes", "Lily", None],
            "city": ["Oaxaca", "Monterrey", "Tijuana", "Cancun", None],
            "operation": ["INSERT", "INSERT", "INSERT", "INSERT", "DELETE"],
            "sequenceNum": [1, 1, 2, 2, 6],
        }
    )


class Flows(unittest.TestCase):
    def setUp(self) -> None:
        self.warehouse = os.path.join(tempfile.mkdtemp(), "warehouse")
        self.s = cdc.CdcSession(self.warehouse)

    def rows(self, query: str) -> list:
        return pa.table(self.s.sql(query)).to_pylist()

    def test_debezium_folder_with_a_key_change(self) -> None:
        """Debezium JSON events: clauses derived, a key change deletes the old key."""
        import json

        folder = os.path.join(tempfile.mkdtemp(), "cdc")
        os.makedirs(folder)

        def event(op, before, after, lsn):
            source = {"connector": "postgresql", "lsn": lsn, "ts_ms": 1000 + lsn}
            return json.dumps({"before": before, "after": after, "source": source, "op": op})

        lines = [
            event("r", None, {"id": 1, "name": "Ann"}, 10),
            event("r", None, {"id": 2, "name": "Bob"}, 11),
            event("u", {"id": 2, "name": "Bob"}, {"id": 20, "name": "Bob"}, 20),
            event("d", {"id": 1, "name": "Ann"}, None, 21),
        ]
        with open(os.path.join(folder, "part-0.json"), "w") as f:
            f.write("\n".join(lines) + "\nnull\n")
        self.s.create_streaming_table("people")
        metrics = self.s.create_auto_cdc_flow(
            target="people", source=f"debezium('{folder}/')", keys=["id"]
        )
        self.assertEqual(metrics["num_input_rows"], 5)
        self.assertEqual(self.rows("SELECT * FROM people"), [{"id": 20, "name": "Bob"}])

    def test_previous_keys(self) -> None:
        self.s.register(
            "moves",
            pa.table({"id": [1, 10], "old_id": [None, 1], "v": ["a", "a"], "seq": [1, 2]}),
        )
        self.s.create_streaming_table("moved")
        self.s.create_auto_cdc_flow(
            target="moved",
            source="moves",
            keys=["id"],
            previous_keys=["old_id"],
            sequence_by="seq",
            except_column_list=["old_id", "seq"],
        )
        self.assertEqual(self.rows("SELECT * FROM moved"), [{"id": 10, "v": "a"}])

    def test_scd1_flow_from_pyarrow(self) -> None:
        self.s.register("users", users_cdf())
        self.s.create_streaming_table("target")
        metrics = self.s.create_auto_cdc_flow(
            target="target",
            source="users",
            keys=["userId"],
            sequence_by="sequenceNum",
            apply_as_deletes="operation = 'DELETE'",
            except_column_list=["operation", "sequenceNum"],
            stored_as_scd_type=1,
        )
        self.assertEqual(metrics["flow"], "target")
        self.assertEqual(metrics["num_input_rows"], 5)
        self.assertEqual(
            self.rows('SELECT * FROM target ORDER BY "userId"'),
            [
                {"userId": 124, "name": "Raul", "city": "Oaxaca"},
                {"userId": 125, "name": "Mercedes", "city": "Tijuana"},
                {"userId": 126, "name": "Lily", "city": "Cancun"},
            ],
        )

    def test_scd2_flow_from_polars_then_refresh(self) -> None:
        events = pl.DataFrame(
            {"id": [1, 1], "city": ["rome", "paris"], "seq": [1, 2]}
        )
        self.s.register("moves", events)
        self.s.create_streaming_table("history")
        self.s.create_auto_cdc_flow(
            target="history", source="moves", keys=["id"], sequence_by="seq",
            except_column_list=["seq"], stored_as_scd_type="2",
        )
        self.s.register(
            "moves", pl.DataFrame({"id": [1], "city": ["oslo"], "seq": [3]})
        )
        runs = self.s.refresh("history")
        self.assertEqual([(r["flow"], r["num_input_rows"]) for r in runs], [("history", 1)])
        self.assertEqual(
            self.rows("SELECT city, __start_at, __end_at FROM history ORDER BY __start_at"),
            [
                {"city": "rome", "__start_at": 1, "__end_at": 2},
                {"city": "paris", "__start_at": 2, "__end_at": 3},
                {"city": "oslo", "__start_at": 3, "__end_at": None},
            ],
        )

    def test_snapshot_flow(self) -> None:
        self.s.register("snap", pa.table({"id": [1, 2], "price": [10, 20]}))
        self.s.create_streaming_table("products")
        self.s.create_auto_cdc_from_snapshot_flow(
            target="products", source="snap", keys=["id"], stored_as_scd_type=2,
        )
        self.s.register("snap", pa.table({"id": [1, 3], "price": [11, 30]}))
        self.s.refresh("products")
        rows = self.rows(
            "SELECT id, price, __end_at IS NULL AS current FROM products ORDER BY id, price"
        )
        self.assertEqual(
            rows,
            [
                {"id": 1, "price": 10, "current": False},
                {"id": 1, "price": 11, "current": True},
                {"id": 2, "price": 20, "current": False},
                {"id": 3, "price": 30, "current": True},
            ],
        )

    def test_snapshot_flow_from_a_function(self) -> None:
        snapshots = {
            1: pa.table({"id": [1, 2], "price": [10, 20]}),
            2: pa.table({"id": [1], "price": [15]}),
        }

        def next_snapshot_and_version(latest):
            version = 1 if latest is None else latest + 1
            return (snapshots[version], version) if version in snapshots else None

        self.s.create_streaming_table("prices")
        runs = self.s.create_auto_cdc_from_snapshot_flow(
            target="prices", source=next_snapshot_and_version, keys=["id"],
        )
        self.assertEqual(len(runs), 2)
        self.assertEqual(self.rows("SELECT * FROM prices"), [{"id": 1, "price": 15}])
        snapshots[3] = pa.table({"id": [1, 3], "price": [15, 30]})
        self.s.refresh("prices")
        self.assertEqual(
            self.rows("SELECT * FROM prices ORDER BY id"),
            [{"id": 1, "price": 15}, {"id": 3, "price": 30}],
        )

    def test_a_callback_calling_its_session_is_an_error(self) -> None:
        def next_snapshot_and_version(latest):
            self.s.sql("SELECT 1")
            return None

        self.s.create_streaming_table("prices")
        with self.assertRaisesRegex(
            Exception, "cannot be called from inside a snapshot callback"
        ):
            self.s.create_auto_cdc_from_snapshot_flow(
                target="prices", source=next_snapshot_and_version, keys=["id"],
            )

    def test_snapshot_versions_that_are_not_integers(self) -> None:
        import datetime as dt

        days = {
            dt.datetime(2024, 5, 1, 6, 0): pa.table({"id": [1, 2], "price": [10, 20]}),
            dt.datetime(2024, 5, 2, 6, 0): pa.table({"id": [1], "price": [15]}),
        }
        seen = []

        def by_timestamp(latest):
            seen.append(latest)
            later = sorted(d for d in days if latest is None or d > latest)
            return (days[later[0]], later[0]) if later else None

        self.s.create_streaming_table("daily")
        runs = self.s.create_auto_cdc_from_snapshot_flow(
            target="daily", source=by_timestamp, keys=["id"], stored_as_scd_type=2,
        )
        self.assertEqual(len(runs), 2)
        # the function gets back the datetime it returned
        self.assertEqual(seen, [None, dt.datetime(2024, 5, 1, 6, 0), dt.datetime(2024, 5, 2, 6, 0)])
        self.assertEqual(
            self.rows("SELECT id, price, __start_at, __end_at FROM daily ORDER BY id, __start_at"),
            [
                {"id": 1, "price": 10, "__start_at": dt.datetime(2024, 5, 1, 6, 0),
                 "__end_at": dt.datetime(2024, 5, 2, 6, 0)},
                {"id": 1, "price": 15, "__start_at": dt.datetime(2024, 5, 2, 6, 0), "__end_at": None},
                {"id": 2, "price": 20, "__start_at": dt.datetime(2024, 5, 1, 6, 0),
                 "__end_at": dt.datetime(2024, 5, 2, 6, 0)},
            ],
        )

        names = {"2024-05-01": pa.table({"id": [1], "v": ["a"]}), "2024-05-03": pa.table({"id": [1], "v": ["b"]})}

        def by_name(latest):
            later = sorted(n for n in names if latest is None or n > latest)
            return (names[later[0]], later[0]) if later else None

        self.s.create_streaming_table("named")
        self.s.create_auto_cdc_from_snapshot_flow(target="named", source=by_name, keys=["id"])
        self.assertEqual(self.rows("SELECT * FROM named"), [{"id": 1, "v": "b"}])

        self.s.create_streaming_table("flags")
        with self.assertRaisesRegex(cdc.AutoCdcError, "version must be an integer.*got True"):
            self.s.create_auto_cdc_from_snapshot_flow(
                target="flags", source=lambda latest: (pa.table({"id": [1]}), True), keys=["id"],
            )
        self.assertEqual(self.rows("SELECT count(*) AS n FROM flags"), [{"n": 0}])

    def test_partial_updates_and_bitemporal(self) -> None:
        self.s.register(
            "feed",
            pa.table({"id": [1, 1], "a": [1, None], "b": ["x", "y"], "seq": [1, 2]}),
        )
        self.s.create_streaming_table("partial")
        self.s.create_auto_cdc_flow(
            target="partial", source="feed", keys=["id"], sequence_by="seq",
            except_column_list=["seq"], ignore_null_updates=True,
        )
        self.assertEqual(self.rows("SELECT * FROM partial"), [{"id": 1, "a": 1, "b": "y"}])
        self.s.register(
            "bev", pa.table({"id": [1, 1], "v": ["a", "b"], "bt": [10, 10], "st": [100, 200]})
        )
        self.s.create_streaming_table("bi")
        self.s.create_auto_cdc_flow(
            target="bi", source="bev", keys=["id"], sequence_by="bt",
            system_sequence_by="st", except_column_list=["bt", "st"],
            stored_as_scd_type="BITEMPORAL",
        )
        self.assertEqual(
            self.rows("SELECT v, __system_start_at, __system_end_at FROM bi ORDER BY __system_start_at"),
            [
                {"v": "a", "__system_start_at": 100, "__system_end_at": 200},
                {"v": "b", "__system_start_at": 200, "__system_end_at": None},
            ],
        )

    def test_per_column_sequencing(self) -> None:
        """Two services writing different columns keep each other's late writes."""
        self.s.register(
            "svc",
            pa.table({"id": [1, 1], "street": ["Main", None], "iban": [None, "DE01"], "seq": [10, 20]}),
        )
        self.s.create_streaming_table(
            "customers", table_properties=[("autocdc.sequencePerColumn", "true")]
        )
        self.s.create_auto_cdc_flow(
            target="customers", source="svc", keys=["id"], sequence_by="seq",
            except_column_list=["seq"], ignore_null_updates=True,
        )
        self.s.register(
            "svc",
            pa.table({
                "id": [1], "street": ["Elm"], "iban": pa.array([None], pa.string()), "seq": [15],
            }),
        )
        self.s.refresh("customers")
        self.assertEqual(
            self.rows("SELECT * FROM customers"), [{"id": 1, "street": "Elm", "iban": "DE01"}]
        )

    def test_history_queries(self) -> None:
        self.s.register(
            "hist",
            pa.table({
                "id": [1, 1, 2],
                "v": ["a", "b", "c"],
                "bt": [datetime(2024, 1, 1), datetime(2024, 3, 1), datetime(2024, 2, 1)],
                "st": [10, 20, 20],
            }),
        )
        self.s.create_streaming_table("h2")
        self.s.create_auto_cdc_flow(
            target="h2", source="hist", keys=["id"], sequence_by="bt",
            except_column_list=["bt", "st"], stored_as_scd_type=2,
        )
        at = lambda r: sorted(pa.table(r).to_pylist(), key=lambda row: row["id"])
        self.assertEqual(at(self.s.scd2_as_of("h2", datetime(2024, 1, 15))), [{"id": 1, "v": "a"}])
        self.assertEqual(
            at(self.s.scd2_as_of("h2", datetime(2024, 3, 1))),
            [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}],
        )
        self.s.create_streaming_table("hb")
        self.s.create_auto_cdc_flow(
            target="hb", source="hist", keys=["id"], sequence_by="bt",
            system_sequence_by="st", except_column_list=["bt", "st"],
            stored_as_scd_type="BITEMPORAL",
        )
        self.assertEqual(at(self.s.bitemporal_as_of("hb", datetime(2024, 3, 2), 15)), [{"id": 1, "v": "a"}])
        self.assertEqual(
            at(self.s.bitemporal_as_of("hb", datetime(2024, 3, 2))),
            [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}],
        )
        self.assertEqual(at(self.s.table_as_of("h2", 0)), [])
        self.assertEqual(len(at(self.s.table_as_of("h2", datetime(2999, 1, 1)))), 3)
        with self.assertRaisesRegex(cdc.AutoCdcError, "'hb' is BITEMPORAL"):
            self.s.scd2_as_of("hb", datetime(2024, 1, 1))
        with self.assertRaisesRegex(TypeError, "scd2_as_of: the business time must be"):
            self.s.scd2_as_of("h2", None)

    def test_restore_rewinds_the_table_and_its_checkpoint(self) -> None:
        folder = os.path.join(self.warehouse, "..", "feed")
        os.makedirs(folder)
        write = lambda name, rows: pq.write_table(
            pa.table({"id": [r[0] for r in rows], "v": [r[1] for r in rows], "seq": [r[2] for r in rows]}),
            os.path.join(folder, name),
        )
        write("f1.parquet", [(1, "a", 1)])
        self.s.sql(f"CREATE EXTERNAL TABLE feed STORED AS PARQUET LOCATION '{folder}/'")
        self.s.create_streaming_table("r")
        self.s.create_auto_cdc_flow(target="r", source="feed", keys=["id"], sequence_by="seq")
        write("f2.parquet", [(1, "b", 2), (2, "c", 1)])
        self.s.refresh("r")
        done = self.s.restore("r", version=1)
        self.assertEqual(done["restored_version"], 1)
        self.assertEqual(done["num_upserted_rows"], 1)
        self.assertEqual(done["num_deleted_rows"], 1)
        self.assertEqual(self.rows("SELECT id, v FROM r"), [{"id": 1, "v": "a"}])
        self.s.refresh("r")
        self.assertEqual(
            self.rows("SELECT id, v FROM r ORDER BY id"), [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}]
        )
        with self.assertRaisesRegex(cdc.AutoCdcError, "the table was created after"):
            self.s.restore("r", timestamp=datetime(2000, 1, 1))
        with self.assertRaisesRegex(TypeError, "exactly one of them"):
            self.s.restore("r")

    def test_a_failed_run_commits_nothing(self) -> None:
        self.s.register("feed", pa.table({"id": [1, 1], "v": ["a", "b"], "seq": [1, 1]}))
        self.s.create_streaming_table("t")
        with self.assertRaisesRegex(cdc.AutoCdcError, "conflicting events for key"):
            self.s.create_auto_cdc_flow(
                target="t", source="feed", keys=["id"], sequence_by="seq",
            )
        self.assertEqual(self.rows("SELECT count(*) AS n FROM event_log('t')"), [{"n": 1}])

    def test_targets_in_a_datafusion_session(self) -> None:
        self.s.register("users", users_cdf())
        self.s.create_streaming_table("target")
        self.s.create_auto_cdc_flow(
            target="target", source="users", keys=["userId"], sequence_by="sequenceNum",
            apply_as_deletes="operation = 'DELETE'",
            except_column_list=["operation", "sequenceNum"],
        )
        ctx = datafusion.SessionContext()
        ctx.register_table("t", self.s.table_provider("target"))
        query = 'SELECT * FROM {} ORDER BY "userId"'
        theirs = ctx.sql(query.format("t")).to_arrow_table().to_pylist()
        self.assertEqual(theirs, self.rows(query.format("target")))
        self.assertEqual(len(theirs), 3)
        ctx.register_table("changes", self.s.table_changes_provider("target", 1))
        changes = 'SELECT "userId", _change_type FROM {} ORDER BY "userId"'
        self.assertEqual(
            ctx.sql(changes.format("changes")).to_arrow_table().to_pylist(),
            self.rows(changes.format("table_changes('target', 1)")),
        )
        ctx.register_table("before", self.s.table_as_of_provider("target", 0))
        self.assertEqual(ctx.sql("SELECT count(*) AS n FROM before").to_arrow_table().to_pylist(), [{"n": 0}])
        with self.assertRaisesRegex(ValueError, "no streaming table"):
            self.s.table_provider("nope")
        with self.assertRaisesRegex(cdc.AutoCdcError, "versions are 0 to 1"):
            self.s.table_as_of_provider("target", 7)

    def test_pandas_source(self) -> None:
        self.s.register(
            "feed", pd.DataFrame({"id": [1, 2, 1], "v": ["a", "b", "c"], "seq": [1, 1, 2]})
        )
        self.s.create_streaming_table("t")
        self.s.create_auto_cdc_flow(
            target="t", source="feed", keys=["id"], sequence_by="seq", column_list=["id", "v"],
        )
        self.assertEqual(
            self.rows("SELECT * FROM t ORDER BY id"), [{"id": 1, "v": "c"}, {"id": 2, "v": "b"}]
        )
        self.assertEqual(self.s.sql("SELECT * FROM t ORDER BY id").to_pandas()["v"].tolist(), ["c", "b"])

    def test_results_are_arrow_for_every_reader(self) -> None:
        result = self.s.sql("SELECT 1 AS a, 'x' AS b")
        self.assertEqual(result.num_rows, 1)
        self.assertEqual(result.column_names, ["a", "b"])
        self.assertEqual(result.to_arrow_table().to_pylist(), [{"a": 1, "b": "x"}])
        self.assertEqual(pl.DataFrame(result).to_dicts(), [{"a": 1, "b": "x"}])
        self.assertIn("| a | b |", str(result))

    def test_tables_survive_the_session(self) -> None:
        self.s.register("users", users_cdf())
        self.s.sql("CREATE STREAMING TABLE t")
        self.s.create_auto_cdc_flow(
            target="t", source="users", keys=["userId"], sequence_by="sequenceNum",
            column_list=["userId", "city"],
        )
        again = cdc.CdcSession(self.warehouse)
        self.assertEqual(pa.table(again.sql("SELECT count(*) AS n FROM t")).to_pylist(), [{"n": 4}])

    def test_history_methods_read_what_another_session_committed(self) -> None:
        self.s.register("src", pa.table({"id": [1], "v": ["a"], "seq": [1]}))
        self.s.create_streaming_table("h")
        self.s.create_auto_cdc_flow(
            target="h", source="src", keys=["id"], sequence_by="seq", stored_as_scd_type=2,
        )
        other = cdc.CdcSession(self.warehouse)
        self.assertEqual(pa.table(other.table_as_of("h", 1)).to_pylist()[0]["v"], "a")
        self.s.register("src", pa.table({"id": [1], "v": ["b"], "seq": [2]}))
        self.s.sql("REFRESH STREAMING TABLE h")
        self.assertEqual(
            [r["v"] for r in pa.table(other.table_as_of("h", 2)).to_pylist()], ["a", "b"]
        )
        self.assertEqual(pa.table(other.scd2_as_of("h", 2)).to_pylist(), [{"id": 1, "v": "b", "seq": 2}])

    def test_bad_arguments_and_engine_errors(self) -> None:
        self.s.register("users", users_cdf())
        self.s.create_streaming_table("target")
        with self.assertRaises(TypeError):
            self.s.create_auto_cdc_flow(
                target="target", source="users", keys=["userId"],
                sequence_by="sequenceNum", no_such_parameter=1,
            )
        with self.assertRaisesRegex(ValueError, "stored_as_scd_type"):
            self.s.create_auto_cdc_flow(
                target="target", source="users", keys=["userId"],
                sequence_by="sequenceNum", stored_as_scd_type=3,
            )
        with self.assertRaisesRegex(TypeError, "register\\('x'\\): expected Arrow data"):
            self.s.register("x", [1, 2, 3])
        with self.assertRaisesRegex(cdc.AutoCdcError, "flow 'target'.*SEQUENCE BY.*nope"):
            self.s.create_auto_cdc_flow(
                target="target", source="users", keys=["userId"], sequence_by="nope",
            )
        # nothing was created by the failed flow
        self.assertEqual(self.rows("SELECT count(*) AS n FROM target"), [{"n": 0}])


if __name__ == "__main__":
    unittest.main()


class Pipelines(unittest.TestCase):
    def test_update_pipeline_runs_tables_in_dependency_order(self) -> None:
        folder = tempfile.mkdtemp()
        s = cdc.CdcSession(os.path.join(folder, "warehouse"))
        s.register("raw", pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"],
                                    "seq": pa.array([1, 1], pa.int32())}))
        s.create_streaming_table("bronze")
        s.create_auto_cdc_flow(target="bronze", source="raw", keys=["id"], sequence_by="seq")
        s.create_streaming_table("silver")
        s.create_auto_cdc_flow(target="silver", source="bronze", keys=["id"], sequence_by="seq",
                               stored_as_scd_type=2)
        update = s.update_pipeline()
        self.assertEqual([(t["table"], t["status"]) for t in update["tables"]],
                         [("bronze", "updated"), ("silver", "updated")])
        full = s.update_pipeline(full_refresh=["silver"])
        runs = [t["runs"][0] for t in full["tables"]]
        # silver read bronze again whole; its rows written again unchanged
        # are no change
        self.assertEqual(runs[1]["num_input_rows"], 2)
        self.assertEqual([r["num_upserted_rows"] for r in runs], [0, 0])
        self.assertNotEqual(full["update_id"], update["update_id"])
        with self.assertRaises(TypeError):
            s.update_pipeline(full_refresh=3)


class AutoCdcInAQuery(unittest.TestCase):
    def test_the_relation_folds_registered_events(self) -> None:
        s = cdc.CdcSession(os.path.join(tempfile.mkdtemp(), "warehouse"))
        s.register("events", pa.table({"id": pa.array([1, 1, 2], pa.int32()),
                                       "v": ["a", "b", "c"],
                                       "seq": pa.array([1, 2, 1], pa.int32())}))
        rows = pa.table(s.sql(
            "SELECT id, v, __START_AT, __END_AT FROM AUTO CDC (SELECT * FROM events) KEYS (id) "
            "SEQUENCE BY seq COLUMNS (id, v) STORED AS SCD TYPE 2 ORDER BY id, __START_AT"
        )).to_pylist()
        self.assertEqual(
            [tuple(r.values()) for r in rows],
            [(1, "a", 1, 2), (1, "b", 2, None), (2, "c", 1, None)],
        )
        # the relation as a table of a datafusion-python session
        ctx = datafusion.SessionContext()
        ctx.register_table("folded", s.query_provider(
            "SELECT * FROM AUTO CDC (SELECT * FROM events) KEYS (id) "
            "SEQUENCE BY seq COLUMNS (id, v)"
        ))
        self.assertEqual(
            ctx.sql("SELECT id, v FROM folded WHERE id > 0 ORDER BY id").to_arrow_table().to_pylist(),
            [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}],
        )
        with self.assertRaisesRegex(cdc.AutoCdcError, "SEQUENCE BY"):
            s.query_provider("SELECT * FROM AUTO CDC (SELECT * FROM events) KEYS (id) "
                             "SEQUENCE BY nope")
        # a statement would run when planned: refused, nothing run
        for statement in ["CREATE TABLE made AS SELECT 1 AS x", "DROP TABLE events",
                          "INSERT INTO events VALUES (9, 'z', 9)", "SELECT 1; DROP TABLE events"]:
            with self.assertRaisesRegex(cdc.AutoCdcError, "not a query"):
                s.query_provider(statement)
        self.assertEqual(pa.table(s.sql("SELECT count(*) AS n FROM events")).to_pylist(), [{"n": 3}])
        with self.assertRaises(cdc.AutoCdcError):
            s.sql("SELECT * FROM made")
        # WITH CHANGES: the change feed that update writes
        changes = pa.table(s.sql(
            "SELECT id, v, _change_type FROM AUTO CDC (SELECT * FROM events) KEYS (id) "
            "SEQUENCE BY seq COLUMNS (id, v) WITH CHANGES ORDER BY id"
        )).to_pylist()
        self.assertEqual(
            [tuple(r.values()) for r in changes],
            [(1, "b", "insert"), (2, "c", "insert")],
        )


class Arguments(unittest.TestCase):
    """Parameters mean what their SQL means, or are refused naming themselves."""

    def setUp(self) -> None:
        self.warehouse = os.path.join(tempfile.mkdtemp(), "warehouse")
        self.s = cdc.CdcSession(self.warehouse)
        self.s.register(
            "feed",
            pa.table({"id": [1, 1, 1], "a": ["a1", "a2", "a2"], "b": ["b1", "b1", "b2"], "seq": [1, 2, 3]}),
        )

    def test_table_names_read_as_sql_names_them(self) -> None:
        # unquoted names fold to lower case, as in s.sql and as sources do
        self.s.create_streaming_table("Users")
        self.s.create_auto_cdc_flow(target="Users", source="feed", keys=["id"], sequence_by="seq")
        self.s.create_streaming_table("down")
        self.s.create_auto_cdc_flow(target="down", source="Users", keys=["id"], sequence_by="seq")
        self.assertEqual(pa.table(self.s.sql("SELECT id, a FROM USERS")).num_rows, 1)
        self.assertEqual(self.s.refresh("USERS")[0]["flow"], "users")
        # a quoted name keeps its case
        self.s.create_streaming_table('"Mixed"')
        self.s.create_auto_cdc_flow(target='"Mixed"', source="feed", keys=["id"], sequence_by="seq")
        self.assertEqual(pa.table(self.s.sql('SELECT a FROM "Mixed"')).to_pylist(), [{"a": "a2"}])
        # and so do the history queries and providers
        self.assertEqual(pa.table(self.s.table_as_of('"Mixed"', 1)).num_rows, 1)
        self.assertEqual(pa.table(self.s.sql("""SELECT * FROM table_changes('"Mixed"', 0)""")).num_rows, 1)
        ctx = datafusion.SessionContext()
        ctx.register_table("m", self.s.table_provider('"Mixed"'))
        ctx.register_table("u", self.s.table_provider("Users"))
        self.assertEqual(ctx.sql("SELECT count(*) AS n FROM m, u").to_arrow_table().to_pylist(), [{"n": 1}])

    def test_a_declared_schema_keeps_the_tables_name(self) -> None:
        self.s.create_streaming_table('"Typed"', schema="id BIGINT, v STRING")
        self.s.create_streaming_table('"Sp Tbl"', schema="id BIGINT")
        self.assertEqual(pa.table(self.s.sql('SELECT * FROM "Typed"')).column_names, ["id", "v"])
        self.assertEqual(pa.table(self.s.sql('SELECT * FROM "Sp Tbl"')).column_names, ["id"])
        with self.assertRaises(Exception):
            self.s.sql("SELECT * FROM typed")
        # a quoted part holding a dot is refused, as SQL refuses it
        for schema in [None, "id BIGINT"]:
            with self.assertRaisesRegex(Exception, "name parts must contain no '.'"):
                self.s.create_streaming_table('"we.ird"', schema=schema)
        with self.assertRaises(Exception):
            self.s.sql("SELECT * FROM we.ird")

    def test_settings_show_as_in_the_cli(self) -> None:
        self.s.sql("SET autocdc.deletion_vector_max_fraction = 0.25")
        shown = pa.table(self.s.sql("SHOW autocdc.deletion_vector_max_fraction")).to_pylist()
        self.assertEqual(shown, [{"name": "autocdc.deletion_vector_max_fraction", "value": "0.25"}])
        with self.assertRaisesRegex(Exception, "is not a fraction of at least 0"):
            self.s.sql("SET autocdc.deletion_vector_max_fraction = -2")

    def test_comment_is_the_tables_description(self) -> None:
        self.s.create_streaming_table("t", comment="my table", table_properties={"autocdc.buckets": "4"})
        properties = {r["key"]: r["value"] for r in pa.table(self.s.sql("SHOW TBLPROPERTIES t")).to_pylist()}
        self.assertNotIn("comment", properties)
        self.assertEqual(properties["autocdc.buckets"], "4")
        # the same declaration in SQL is the table as it is
        self.s.sql("CREATE OR REFRESH STREAMING TABLE t COMMENT 'my table'")
        logs = [
            os.path.join(folder, name)
            for folder, _, names in os.walk(os.path.join(self.warehouse, "public", "t"))
            for name in names
            if name.endswith(".json") and folder.endswith("_delta_log")
        ]
        self.assertTrue(logs)
        described = [p for p in logs if '"description":"my table"' in open(p).read()]
        self.assertTrue(described, logs)

    def test_exclusive_pairs_and_bad_values_are_refused(self) -> None:
        self.s.create_streaming_table("h")
        for pair in [
            {"track_history_column_list": ["a"], "track_history_except_column_list": ["a"]},
            {"ignore_null_updates_column_list": ["a"], "ignore_null_updates_except_column_list": ["a"]},
        ]:
            with self.assertRaises(ValueError):
                self.s.create_auto_cdc_flow(
                    target="h", source="feed", keys=["id"], sequence_by="seq",
                    except_column_list=["seq"], stored_as_scd_type=2, **pair)
        with self.assertRaises(TypeError):
            self.s.create_auto_cdc_flow(target="h", source="feed", keys=["id"], sequence_by="seq", stored_as_scd_type=True)
        with self.assertRaises(ValueError):
            self.s.create_auto_cdc_flow(target="h", source="feed", keys=["id"], sequence_by="seq", name="")
        with self.assertRaisesRegex(ValueError, "sequence_by must name at least one column"):
            self.s.create_auto_cdc_flow(target="h", source="feed", keys=["id"], sequence_by=[])
        with self.assertRaisesRegex(TypeError, "keys must be a list of column names"):
            self.s.create_auto_cdc_flow(target="h", source="feed", keys="id", sequence_by="seq")
        with self.assertRaisesRegex(TypeError, "keys must be a list of column names"):
            self.s.create_auto_cdc_from_snapshot_flow(target="h", source="feed", keys="id")
        with self.assertRaisesRegex(TypeError, "expect_all"):
            self.s.create_streaming_table("x", expect_all={"a": 1})
        with self.assertRaisesRegex(cdc.AutoCdcError, "expectation 'bad'"):
            self.s.create_streaming_table("y", expect_all_or_drop={"bad": "v >"})

    def test_providers_outlive_their_session(self) -> None:
        def lend() -> datafusion.SessionContext:
            s = cdc.CdcSession(os.path.join(tempfile.mkdtemp(), "warehouse"))
            s.register("feed", pa.table({"id": [1], "seq": [1]}))
            s.create_streaming_table("t")
            s.create_auto_cdc_flow(target="t", source="feed", keys=["id"], sequence_by="seq")
            ctx = datafusion.SessionContext()
            ctx.register_table("t", s.table_provider("t"))
            return ctx

        ctx = lend()
        import gc

        gc.collect()
        self.assertEqual(ctx.sql("SELECT * FROM t").to_arrow_table().to_pylist(), [{"id": 1, "seq": 1}])

    def test_a_refused_snapshot_flow_keeps_the_function_it_would_replace(self) -> None:
        self.s.create_streaming_table("q")
        calls = []

        def first(latest):
            calls.append("first")
            return None if latest is not None else (pa.table({"id": [1], "v": [1]}), 1)

        def second(latest):
            calls.append("second")
            return (pa.table({"id": [9], "v": [9]}), 5)

        self.s.create_auto_cdc_from_snapshot_flow(target="q", source=first, keys=["id"])
        with self.assertRaisesRegex(cdc.AutoCdcError, "already exists"):
            self.s.create_auto_cdc_from_snapshot_flow(target="q", source=second, keys=["id"])
        calls.clear()
        self.s.update_pipeline()
        self.assertEqual(calls, ["first"])
        self.assertEqual(pa.table(self.s.sql("SELECT * FROM q")).to_pylist(), [{"id": 1, "v": 1}])

    def test_a_source_name_with_a_space_is_that_table(self) -> None:
        """source='Src Tbl' read table src aliased Tbl: the wrong rows."""
        self.s.register("src", pa.table({"id": [1], "v": ["wrong"], "seq": [1]}))
        self.s.register("Src Tbl", pa.table({"id": [1], "v": ["right"], "seq": [1]}))
        for target in ["a", "b", "c"]:
            self.s.create_streaming_table(target)
        self.s.create_auto_cdc_flow(target="a", source="Src Tbl", keys=["id"], sequence_by="seq")
        self.s.create_auto_cdc_from_snapshot_flow(target="b", source="Src Tbl", keys=["id"])
        self.s.create_append_flow(target="c", source="Src Tbl", once=True)
        for target in ["a", "b", "c"]:
            self.assertEqual(pa.table(self.s.sql(f"SELECT v FROM {target}")).to_pylist(), [{"v": "right"}])

    def test_restore_refuses_a_negative_version(self) -> None:
        self.s.create_streaming_table("r")
        with self.assertRaisesRegex(ValueError, "version"):
            self.s.restore("r", version=-1)
        # not an OverflowError, an AttributeError
        with self.assertRaisesRegex(ValueError, "version must be a commit version"):
            self.s.restore("r", version=10**20)
        with self.assertRaisesRegex(ValueError, "version must be a commit version"):
            self.s.restore("r", version=-(2**200))
        with self.assertRaisesRegex(TypeError, "version must be an int \\(got bool\\)"):
            self.s.restore("r", version=True)
        with self.assertRaisesRegex(TypeError, "version must be an int \\(got str\\)"):
            self.s.restore("r", version="1")
        with self.assertRaisesRegex(TypeError, "timestamp must be a string or a datetime \\(got int\\)"):
            self.s.restore("r", timestamp=12)

    def test_a_snapshot_callback_may_open_another_session(self) -> None:
        other = os.path.join(tempfile.mkdtemp(), "warehouse")
        self.s.create_streaming_table("p")

        def snapshot(latest):
            if latest is not None:
                return None
            cdc.CdcSession(other)
            return (pa.table({"id": [1]}), 1)

        self.s.create_auto_cdc_from_snapshot_flow(target="p", source=snapshot, keys=["id"])
        self.assertEqual(pa.table(self.s.sql("SELECT * FROM p")).to_pylist(), [{"id": 1}])

    def test_register_refuses_the_name_of_a_streaming_table(self) -> None:
        self.s.register("ev", pa.table({"id": [1], "v": ["kept"], "seq": [1]}))
        self.s.create_streaming_table("users")
        self.s.create_auto_cdc_flow(target="users", source="ev", keys=["id"], sequence_by="seq")
        for name in ["users", "Users", "public.users"]:
            with self.assertRaisesRegex(ValueError, "'users' is a streaming table"):
                self.s.register(name, pa.table({"other": [42]}))
        self.assertEqual(
            pa.table(self.s.sql("SELECT id, v FROM users")).to_pylist(), [{"id": 1, "v": "kept"}]
        )
        # a quoted mixed-case name is another table
        self.s.register('"Users"', pa.table({"other": [42]}))
        # an empty name names no table
        with self.assertRaisesRegex(ValueError, "name must not be empty"):
            self.s.register(" ", pa.table({"other": [42]}))
        # a declared type that is none names its column
        with self.assertRaisesRegex(cdc.AutoCdcError, "column 'v' has type NOTATYPE"):
            self.s.create_streaming_table("typed", schema="id INT, v NOTATYPE")

    def test_snapshot_flow_arguments_are_checked_as_the_change_flows_are(self) -> None:
        self.s.register("snap", pa.table({"id": [1], "a": ["x"], "b": [1]}))
        self.s.create_streaming_table("t")
        with self.assertRaisesRegex(ValueError, "not both"):
            self.s.create_auto_cdc_from_snapshot_flow(
                target="t", source="snap", keys=["id"], stored_as_scd_type=2,
                track_history_column_list=["a"], track_history_except_column_list=["a"])
        with self.assertRaisesRegex(ValueError, "name must not be empty"):
            self.s.create_auto_cdc_from_snapshot_flow(target="t", source="snap", keys=["id"], name=" ")
        with self.assertRaisesRegex(cdc.AutoCdcError, "SEQUENCE BY: column 'seq' is named twice"):
            self.s.register("ev", pa.table({"id": [1], "seq": [1]}))
            self.s.create_auto_cdc_flow(target="t", source="ev", keys=["id"], sequence_by=["seq", "seq"])
        self.assertEqual(pa.table(self.s.sql("SELECT count(*) AS n FROM t")).to_pylist(), [{"n": 0}])

    def test_ctrl_c_in_a_snapshot_callback_stays_a_keyboard_interrupt(self) -> None:
        self.s.create_streaming_table("k")

        def interrupted(latest):
            raise KeyboardInterrupt()

        with self.assertRaises(KeyboardInterrupt):
            self.s.create_auto_cdc_from_snapshot_flow(target="k", source=interrupted, keys=["id"])

        def exits(latest):
            raise SystemExit(3)

        self.s.create_streaming_table("e")
        with self.assertRaises(SystemExit):
            self.s.create_auto_cdc_from_snapshot_flow(target="e", source=exits, keys=["id"])

        # a pipeline update reports a failed flow as a row: the interrupt
        # is raised by it all the same, and not by a later call
        state = {"boom": False}

        def later(latest):
            if state["boom"]:
                state["boom"] = False
                raise KeyboardInterrupt()
            return (pa.table({"id": [1]}), 1) if latest is None else None

        self.s.create_streaming_table("later")
        self.s.create_auto_cdc_from_snapshot_flow(target="later", source=later, keys=["id"])
        state["boom"] = True
        with self.assertRaises(KeyboardInterrupt):
            self.s.update_pipeline()
        with self.assertRaisesRegex(cdc.AutoCdcError, "no_such_table"):
            self.s.sql("SELECT * FROM no_such_table")

        def fails(latest):
            raise ValueError("bad")

        self.s.create_streaming_table("f")
        with self.assertRaisesRegex(cdc.AutoCdcError, "ValueError: bad"):
            self.s.create_auto_cdc_from_snapshot_flow(target="f", source=fails, keys=["id"])

    def test_an_interrupt_in_one_sessions_callback_is_raised_by_that_session_only(self) -> None:
        import threading

        other = cdc.CdcSession(os.path.join(tempfile.mkdtemp(), "warehouse"))
        stop = threading.Event()
        leaked = []

        def query_the_other() -> None:
            while not stop.is_set():
                try:
                    other.sql("SELECT 1")
                except BaseException as e:  # noqa: BLE001 - what leaks is the point
                    leaked.append(repr(e))

        threads = [threading.Thread(target=query_the_other) for _ in range(4)]
        for t in threads:
            t.start()
        raised = []
        try:
            for i in range(60):

                def interrupted(latest):
                    raise KeyboardInterrupt()

                self.s.create_streaming_table(f"k{i}")
                try:
                    self.s.create_auto_cdc_from_snapshot_flow(target=f"k{i}", source=interrupted, keys=["id"])
                except BaseException as e:  # noqa: BLE001
                    raised.append(type(e).__name__)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(leaked, [])
        self.assertEqual(raised, ["KeyboardInterrupt"] * 60)

    def test_a_datetime_is_no_point_of_an_integer_sequence(self) -> None:
        self.s.register("hist", pa.table({"id": [1, 1], "v": ["a", "b"], "seq": [1, 5]}))
        self.s.create_streaming_table("h")
        self.s.create_auto_cdc_flow(target="h", source="hist", keys=["id"], sequence_by="seq", stored_as_scd_type=2)
        self.assertEqual(pa.table(self.s.scd2_as_of("h", 3)).to_pylist(), [{"id": 1, "v": "a", "seq": 1}])
        with self.assertRaisesRegex(cdc.AutoCdcError, "does not convert to the table's business time type Int64"):
            self.s.scd2_as_of("h", datetime(1970, 1, 1, 0, 0, 0, 3))

    def test_a_snapshot_function_is_registered_again_in_a_new_session(self) -> None:
        snapshots = {1: pa.table({"id": [1, 2], "v": ["a", "b"]}), 2: pa.table({"id": [2], "v": ["B"]})}
        last = {"version": 1}

        def next_snapshot(latest):
            n = 1 if latest is None else latest + 1
            return (snapshots[n], n) if n <= last["version"] else None

        self.s.create_streaming_table("snap")
        self.s.create_auto_cdc_from_snapshot_flow(target="snap", source=next_snapshot, keys=["id"])
        last["version"] = 2
        # a new process (a new session): the function is not there
        again = cdc.CdcSession(self.warehouse)
        with self.assertRaisesRegex(cdc.AutoCdcError, "register_snapshot_function"):
            again.refresh("snap")
        with self.assertRaisesRegex(cdc.AutoCdcError, "has no snapshot flow 'other'"):
            again.register_snapshot_function("snap", next_snapshot, name="other")
        with self.assertRaisesRegex(TypeError, "function must be callable"):
            again.register_snapshot_function("snap", 5)
        again.register_snapshot_function("snap", next_snapshot)
        again.refresh("snap")
        self.assertEqual(pa.table(again.sql("SELECT * FROM snap")).to_pylist(), [{"id": 2, "v": "B"}])
