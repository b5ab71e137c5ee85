//! A stage's `state:` grant: the key-value store its handler reads and
//! writes (`sluice:plugin/state`, contract 0.2.0), committed with the ack.
//!
//! ```yaml
//! state: true                                   # the stage's own store
//! state: { store: charges, max_bytes: 64MiB }   # a named store; stages naming it share it
//! ```

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::HumanSize;

/// A store's size limit when the stage sets none: 1 GiB.
pub const DEFAULT_STATE_MAX_BYTES: HumanSize = HumanSize::mib(1024);

/// What `state:` grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateGrant {
    /// The store's name within the pipeline; the stage's name when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The most bytes (keys and values) the store holds; a write past it
    /// is refused with `store-full`, never dropped.
    pub max_bytes: HumanSize,
}

impl StateGrant {
    /// The store's name within the pipeline.
    pub fn store_or<'a>(&'a self, stage: &'a str) -> &'a str {
        self.store.as_deref().unwrap_or(stage)
    }
}

impl JsonSchema for StateGrant {
    fn schema_name() -> Cow<'static, str> {
        "StateGrant".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                {"type": "boolean", "description": "`true`: the stage's own store, 1 GiB at most."},
                {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "store": {"type": "string", "description": "The store's name; stages that name the same store share it. Default: the stage's name."},
                        "max_bytes": {"type": "string", "description": "The most bytes the store holds (keys and values), e.g. `64MiB`. Default 1GiB."}
                    }
                }
            ]
        })
    }
}

/// `state:` as YAML gives it: `true`, `false` or a map.
pub(super) fn grant<'de, D: Deserializer<'de>>(d: D) -> Result<Option<StateGrant>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Fields {
        #[serde(default)]
        store: Option<String>,
        #[serde(default)]
        max_bytes: Option<HumanSize>,
    }
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<StateGrant>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("`true`, `false`, or {store, max_bytes}")
        }
        fn visit_bool<E: de::Error>(self, on: bool) -> Result<Self::Value, E> {
            Ok(on.then_some(StateGrant {
                store: None,
                max_bytes: DEFAULT_STATE_MAX_BYTES,
            }))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            match v.trim() {
                "true" => self.visit_bool(true),
                "false" => self.visit_bool(false),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let fields = Fields::deserialize(de::value::MapAccessDeserializer::new(map))?;
            Ok(Some(StateGrant {
                store: fields.store,
                max_bytes: fields.max_bytes.unwrap_or(DEFAULT_STATE_MAX_BYTES),
            }))
        }
    }
    d.deserialize_any(V)
}
