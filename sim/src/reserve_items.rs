//! The reserve items of a request and the answer each got, read with the core's wire
//! decoders, for the oracles that judge reserves item by item (`reserve-duplicate`,
//! `reserve-follower`).

use ctlplane_core::ec::wire::{decode_reply, decode_request, Request};
use ctlplane_core::ec::ReserveRequest;
use serde_json::Value;

/// One reserve of a request: its place in a batch (`None` for a single reserve).
pub struct Item {
    pub index: Option<usize>,
    pub req: ReserveRequest,
}

/// The reserves `frame` asks for, those that decode (a bad item is refused on its own).
pub fn items(frame: &[u8]) -> Vec<Item> {
    match decode_request(frame, usize::MAX) {
        Ok(Request::Reserve(Ok(req))) => vec![Item { index: None, req }],
        Ok(Request::ReserveBatch(items)) => items
            .into_iter()
            .enumerate()
            .filter_map(|(i, item)| item.ok().map(|req| Item { index: Some(i), req }))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether no other item of the request shares `key` with `item`: an earlier item naming
/// the same transfer or tensor may change what the later one finds in the book.
pub fn alone(items: &[Item], item: &Item, key: impl Fn(&ReserveRequest) -> &str) -> bool {
    items.iter().filter(|other| key(&other.req) == key(&item.req)).count() == 1
}

/// The reply to a reserve request, decoded once for all its items.
pub struct Answers(Option<Result<Value, String>>);

impl Answers {
    pub fn of(reply: &[u8]) -> Answers {
        Answers(decode_reply(reply).ok())
    }

    /// What the item at `index` got: its result, or the error it was refused with; `None`
    /// when the reply does not say (it did not decode, or the batch as a whole failed).
    pub fn get(&self, index: Option<usize>) -> Option<Result<&Value, String>> {
        match (self.0.as_ref()?, index) {
            (Ok(result), None) => Some(Ok(result)),
            (Err(error), None) => Some(Err(error.clone())),
            (Ok(result), Some(i)) => {
                let entry = result.get("items")?.get(i)?;
                Some(if entry.get("ok") == Some(&Value::Bool(true)) {
                    entry.get("result").ok_or_else(|| "an ok entry without a result".to_string())
                } else {
                    Err(entry.get("error").map(Value::to_string).unwrap_or_default())
                })
            }
            (Err(_), Some(_)) => None,
        }
    }
}
