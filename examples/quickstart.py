"""Quickstart from Python: the reference pages' SCD 1 and SCD 2 examples.

Run it (after `pip install ./crates/autocdc-python pyarrow`) with:
    python examples/quickstart.py
"""

import pyarrow as pa

import datafusion_autocdc as cdc

s = cdc.CdcSession("./warehouse")

# the change feed of the examples: users, keyed by userId, ordered by sequenceNum
s.register(
    "users",
    pa.table(
        {
            "userId": [124, 123, 125, 126, 123, 125, 125, 123],
            "name": ["Raul", "Isabel", "Mercedes", "Lily", None, "Mercedes", "Mercedes", "Isabel"],
            "city": ["Oaxaca", "Monterrey", "Tijuana", "Cancun", None, "Guadalajara", "Mexicali", "Chihuahua"],
            "operation": ["INSERT", "INSERT", "INSERT", "INSERT", "DELETE", "UPDATE", "UPDATE", "UPDATE"],
            "sequenceNum": [1, 1, 2, 2, 6, 6, 5, 5],
        }
    ),
)

for scd_type, target in [(1, "users_scd1"), (2, "users_scd2")]:
    s.sql(f"DROP STREAMING TABLE IF EXISTS {target}")
    s.create_streaming_table(target)
    metrics = s.create_auto_cdc_flow(
        target=target,
        source="users",
        keys=["userId"],
        sequence_by="sequenceNum",
        apply_as_deletes="operation = 'DELETE'",
        except_column_list=["operation", "sequenceNum"],
        stored_as_scd_type=scd_type,
    )
    print(f"SCD TYPE {scd_type}: {metrics}")
    s.sql(f'SELECT * FROM {target} ORDER BY "userId"').show()
