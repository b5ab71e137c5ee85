//! A YAML document as a tree of positioned nodes, and a serde
//! `Deserializer` over it.
//!
//! Parsing happens once, into this tree (see `parse.rs`). Everything after
//! that works on the tree, so every message can name a line and column:
//!
//! - environment interpolation rewrites string scalars in place and reports
//!   an unset variable at the scalar that uses it;
//! - the typed model is deserialized from the tree by the `Deserializer`
//!   below, which stamps each serde error with the position of the innermost
//!   node it came from (an unknown field at its key, a wrong type at its
//!   value, a missing field at the mapping that lacks it);
//! - semantic checks look positions up by path (`stages[2].publish[0]`) with
//!   [`Node::locate`].

use std::cell::RefCell;
use std::fmt;

use serde::de::value::StrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};

/// A 1-based line and column in the source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: u64,
    /// 1-based column, in characters.
    pub col: u64,
}

/// One node of the document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub pos: Pos,
    pub kind: Kind,
    /// The scalar's text as written, when it came (partly) from `${...}`
    /// interpolation: a numeric or boolean field may then read it as a
    /// number or boolean, and a `config:` value is shown as written.
    pub written: Option<String>,
}

/// A mapping key: always read as text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Key {
    pub pos: Pos,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// One step of a path into the tree (`stages`, `2`, `plugin`): where a
/// problem is reported.
#[derive(Debug, Clone, Copy)]
pub enum Seg<'a> {
    /// A mapping key.
    Key(&'a str),
    /// A sequence index.
    Index(usize),
}

impl Node {
    /// The position of the node at `path`, or of its deepest ancestor that
    /// exists (a field left at its default has no node of its own, so the
    /// error points at the mapping it would belong in).
    pub fn locate(&self, path: &[Seg<'_>]) -> Pos {
        let mut node = self;
        for seg in path {
            let next = match (seg, &node.kind) {
                (Seg::Key(k), Kind::Map(entries)) => entries
                    .iter()
                    .find(|(key, _)| key.name == *k)
                    .map(|(_, v)| v),
                (Seg::Index(i), Kind::Seq(items)) => items.get(*i),
                _ => None,
            };
            match next {
                Some(next) => node = next,
                None => break,
            }
        }
        node.pos
    }

    /// A short name for the node's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::Null => "null",
            Kind::Bool(_) => "a boolean",
            Kind::Int(_) | Kind::UInt(_) => "an integer",
            Kind::Float(_) => "a number",
            Kind::Str(_) => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    /// An interpolated string read where a number or boolean is expected:
    /// resolve its text as YAML would resolve a plain scalar.
    fn resolved(&self) -> Option<Node> {
        let Kind::Str(text) = &self.kind else {
            return None;
        };
        self.written.as_ref()?;
        let text = text.trim();
        let kind = if let Ok(v) = text.parse::<u64>() {
            Kind::UInt(v)
        } else if let Ok(v) = text.parse::<i64>() {
            Kind::Int(v)
        } else if let Ok(v) = text.parse::<f64>() {
            Kind::Float(v)
        } else if let Ok(v) = text.parse::<bool>() {
            Kind::Bool(v)
        } else {
            return None;
        };
        Some(Node {
            pos: self.pos,
            kind,
            written: None,
        })
    }
}

/// A serde error with the position of the node that caused it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeError {
    pub pos: Option<Pos>,
    pub message: String,
}

impl DeError {
    /// Stamps the position, unless an inner node already did.
    fn at(mut self, pos: Pos) -> Self {
        self.pos.get_or_insert(pos);
        self
    }

    /// A struct with a flattened part (a connector block's `TlsOptions`)
    /// finds an unknown key only after reading the whole mapping, and
    /// says just `unknown field `x``: this points at that key, and says
    /// where the allowed ones are listed. (A stage's or sink's, which
    /// flatten in their `Delivery`, get the list itself in `parse.rs`.)
    fn at_unknown_key(mut self, entries: &[(Key, Node)]) -> Self {
        if self.pos.is_some() {
            return self;
        }
        let field = self
            .message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.strip_suffix('`'));
        if let Some((key, _)) = field.and_then(|f| entries.iter().find(|(k, _)| k.name == f)) {
            self.pos = Some(key.pos);
            self.message.push_str(
                "; the options allowed here are in the connector's page (docs/connectors/) \
                 and in `sluice schema`",
            );
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            pos: None,
            message: msg.to_string(),
        }
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::custom(format_args!(
            "expected {}, found {}",
            friendly(&exp.to_string()),
            describe(unexp)
        ))
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::custom(format_args!(
            "{} is not allowed here: expected {}",
            describe(unexp),
            friendly(&exp.to_string())
        ))
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Self::custom(format_args!(
            "unknown field `{field}`; the fields allowed here are {}",
            list(expected)
        ))
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Self::custom(format_args!(
            "unknown value `{variant}`; expected one of {}",
            list(expected)
        ))
    }

    fn missing_field(field: &'static str) -> Self {
        Self::custom(format_args!("missing required field `{field}`"))
    }

    fn duplicate_field(field: &'static str) -> Self {
        Self::custom(format_args!("field `{field}` is given twice"))
    }
}

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// serde's Rust-flavoured expectations in the words of a YAML file.
fn friendly(expected: &str) -> String {
    if let Some(name) = expected.strip_prefix("struct ") {
        return format!("a mapping ({name} settings)");
    }
    match expected {
        "a nonzero u32" => "a whole number of at least 1".into(),
        "u32" | "u64" | "usize" => "a whole number (0 or more)".into(),
        "f64" | "f32" => "a number".into(),
        "a sequence" => "a list".into(),
        "a map" => "a mapping".into(),
        other => other.into(),
    }
}

fn describe(unexp: de::Unexpected<'_>) -> String {
    match unexp {
        de::Unexpected::Unit | de::Unexpected::Option => "nothing (null)".into(),
        de::Unexpected::Str(s) => format!("the text \"{s}\""),
        de::Unexpected::Signed(n) => format!("the number {n}"),
        de::Unexpected::Unsigned(n) => format!("the number {n}"),
        de::Unexpected::Seq => "a list".into(),
        de::Unexpected::Map => "a mapping".into(),
        other => other.to_string(),
    }
}

impl<'de> Deserializer<'de> for &Node {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match &self.kind {
            Kind::Null => visitor.visit_unit(),
            Kind::Bool(v) => visitor.visit_bool(*v),
            Kind::Int(v) => visitor.visit_i64(*v),
            Kind::UInt(v) => visitor.visit_u64(*v),
            Kind::Float(v) => visitor.visit_f64(*v),
            Kind::Str(v) => visitor.visit_str(v),
            Kind::Seq(items) => visitor.visit_seq(Items(items.iter())),
            Kind::Map(entries) => visitor
                .visit_map(Entries {
                    iter: entries.iter(),
                    value: None,
                })
                .map_err(|e| e.at_unknown_key(entries)),
        };
        result.map_err(|e| e.at(self.pos))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.kind {
            Kind::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
        .map_err(|e| e.at(self.pos))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor
            .visit_newtype_struct(self)
            .map_err(|e| e.at(self.pos))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.kind {
            Kind::Str(s) => {
                let de: StrDeserializer<'_, DeError> = s.as_str().into_deserializer();
                visitor.visit_enum(de)
            }
            // `{variant: value}`: a variant with data, as YAML writes it.
            Kind::Map(entries) if entries.len() == 1 => visitor.visit_enum(Variant(&entries[0])),
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        }
        .map_err(|e| e.at(self.pos))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.scalar(visitor)
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

thread_local! {
    /// While [`noting_resolved`] runs: where an interpolated string was
    /// read as a number or boolean.
    static RESOLVED: RefCell<Option<Vec<Pos>>> = const { RefCell::new(None) };
}

/// Runs `read`, and returns with its result the positions of the
/// interpolated strings it read as numbers or booleans (for
/// [`Node::resolve_at`]).
pub(crate) fn noting_resolved<T>(read: impl FnOnce() -> T) -> (T, Vec<Pos>) {
    let outer = RESOLVED.replace(Some(Vec::new()));
    let value = read();
    let noted = RESOLVED.replace(outer).unwrap_or_default();
    (value, noted)
}

impl Node {
    /// A number or boolean is wanted: an interpolated string is resolved
    /// first, so `concurrency: ${WORKERS:-4}` works.
    fn scalar<'de, V: Visitor<'de>>(&self, visitor: V) -> Result<V::Value, DeError> {
        match self.resolved() {
            Some(node) => {
                RESOLVED.with_borrow_mut(|noted| {
                    if let Some(noted) = noted {
                        noted.push(self.pos);
                    }
                });
                node.deserialize_any(visitor)
            }
            None => self.deserialize_any(visitor),
        }
    }

    /// Makes the interpolated strings at `positions`, in this node or
    /// below, the numbers or booleans they were read as. serde reads a
    /// `flatten`ed part through a buffer of plain values, where such a
    /// string would stay a string and fail a numeric field; the part is
    /// read alone first, under [`noting_resolved`], to learn which.
    pub(crate) fn resolve_at(&mut self, positions: &[Pos]) {
        if positions.contains(&self.pos)
            && let Some(node) = self.resolved()
        {
            self.kind = node.kind;
        }
        match &mut self.kind {
            Kind::Seq(items) => items.iter_mut().for_each(|n| n.resolve_at(positions)),
            Kind::Map(entries) => entries
                .iter_mut()
                .for_each(|(_, n)| n.resolve_at(positions)),
            _ => {}
        }
    }

    fn unexpected(&self) -> de::Unexpected<'_> {
        match &self.kind {
            Kind::Null => de::Unexpected::Unit,
            Kind::Bool(v) => de::Unexpected::Bool(*v),
            Kind::Int(v) => de::Unexpected::Signed(*v),
            Kind::UInt(v) => de::Unexpected::Unsigned(*v),
            Kind::Float(v) => de::Unexpected::Float(*v),
            Kind::Str(v) => de::Unexpected::Str(v),
            Kind::Seq(_) => de::Unexpected::Seq,
            Kind::Map(_) => de::Unexpected::Map,
        }
    }
}

struct Items<'a>(std::slice::Iter<'a, Node>);

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.0.next() {
            Some(node) => seed.deserialize(node).map(Some).map_err(|e| e.at(node.pos)),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// The one entry of a `{variant: value}` mapping, read as an enum.
struct Variant<'a>(&'a (Key, Node));

impl<'de, 'a> de::EnumAccess<'de> for Variant<'a> {
    type Error = DeError;
    type Variant = &'a Node;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, &'a Node), DeError> {
        let (key, value) = self.0;
        let de: StrDeserializer<'_, DeError> = key.name.as_str().into_deserializer();
        let variant = seed.deserialize(de).map_err(|e| e.at(key.pos))?;
        Ok((variant, value))
    }
}

impl<'de> de::VariantAccess<'de> for &Node {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        match self.kind {
            Kind::Null => Ok(()),
            _ => Err(de::Error::invalid_type(self.unexpected(), &"no value")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self).map_err(|e| e.at(self.pos))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        Deserializer::deserialize_map(self, visitor)
    }
}

struct Entries<'a> {
    iter: std::slice::Iter<'a, (Key, Node)>,
    value: Option<&'a Node>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.iter.next() {
            Some((key, value)) => {
                self.value = Some(value);
                let de: StrDeserializer<'_, DeError> = key.name.as_str().into_deserializer();
                seed.deserialize(de).map(Some).map_err(|e| e.at(key.pos))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        match self.value.take() {
            Some(node) => seed.deserialize(node).map_err(|e| e.at(node.pos)),
            None => Err(de::Error::custom("a mapping value was read before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// Reads a document into a tree, through serde-saphyr's `Spanned`.
pub(crate) mod read {
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_saphyr::Spanned;

    use super::{Key, Kind, Node, Pos};

    fn pos(span: &serde_saphyr::Location) -> Pos {
        Pos {
            line: span.line(),
            col: span.column(),
        }
    }

    impl<'de> Deserialize<'de> for Node {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let spanned = Spanned::<Kind>::deserialize(d)?;
            Ok(Node {
                pos: pos(&spanned.referenced),
                kind: spanned.value,
                written: None,
            })
        }
    }

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let spanned = Spanned::<String>::deserialize(d)?;
            Ok(Key {
                pos: pos(&spanned.referenced),
                name: spanned.value,
            })
        }
    }

    impl<'de> Deserialize<'de> for Kind {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(KindVisitor)
        }
    }

    struct KindVisitor;

    impl<'de> Visitor<'de> for KindVisitor {
        type Value = Kind;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a YAML value")
        }
        fn visit_unit<E>(self) -> Result<Kind, E> {
            Ok(Kind::Null)
        }
        fn visit_none<E>(self) -> Result<Kind, E> {
            Ok(Kind::Null)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Kind, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_bool<E>(self, v: bool) -> Result<Kind, E> {
            Ok(Kind::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Kind, E> {
            Ok(Kind::Int(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Kind, E> {
            Ok(Kind::UInt(v))
        }
        fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Kind, E> {
            i64::try_from(v)
                .map(Kind::Int)
                .map_err(|_| E::custom(format_args!("the integer {v} is too large")))
        }
        fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Kind, E> {
            u64::try_from(v)
                .map(Kind::UInt)
                .map_err(|_| E::custom(format_args!("the integer {v} is too large")))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Kind, E> {
            Ok(Kind::Float(v))
        }
        fn visit_str<E>(self, v: &str) -> Result<Kind, E> {
            Ok(Kind::Str(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Kind, E> {
            Ok(Kind::Str(v))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
            let mut items = Vec::new();
            while let Some(node) = seq.next_element::<Node>()? {
                items.push(node);
            }
            Ok(Kind::Seq(items))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
            let mut entries = Vec::new();
            while let Some(entry) = map.next_entry::<Key, Node>()? {
                entries.push(entry);
            }
            Ok(Kind::Map(entries))
        }
    }
}
