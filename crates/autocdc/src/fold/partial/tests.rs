//! SCD 1 under IGNORE NULL UPDATES on hand-made batches, every split.

use super::super::columns::Kind;
use super::super::test_support::{del, every_split, fold, rows, spec, up, up_null, Ev};
use super::super::{PartialUpdates, ScdType};

fn live(events: &[Ev]) -> Vec<String> {
    let spec = spec(
        ScdType::Type1,
        vec![],
        Some(PartialUpdates::IgnoreNulls(vec![1])),
    );
    every_split(events.len(), |split| {
        let (out, _) = fold(&spec, events, None, split).expect("fold");
        rows(&out, &[Kind::Upsert as i8])
    })
}

/// | events                          | live row  | why                          |
/// |---------------------------------|-----------|------------------------------|
/// | a@1, NULL@2                     | a@2       | NULL keeps the value         |
/// | stored a@1, NULL@3              | a@3       | also against the stored row  |
/// | a@1, delete@2, NULL@3           | NULL@3    | after a delete: from nothing |
/// | stored a@1, NULL@3, late z@0    | a@3       | late events are still late   |
#[test]
fn nulls_keep_the_current_value() {
    assert_eq!(
        live(&[up(1, "a", 1), up_null(1, 2)]),
        ["id=1 v=a cdc_seq=2"]
    );
    assert_eq!(
        live(&[up(1, "a", 1).stored(), up_null(1, 3)]),
        ["id=1 v=a cdc_seq=3"]
    );
    assert_eq!(
        live(&[up(1, "a", 1), del(1, 2), up_null(1, 3)]),
        ["id=1 v=NULL cdc_seq=3"]
    );
    assert_eq!(
        live(&[up(1, "a", 1).stored(), up_null(1, 3), up(1, "z", 0)]),
        ["id=1 v=a cdc_seq=3"]
    );
}
