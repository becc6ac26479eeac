//! Ruby values <-> JSON values, matching what Ruby's `JSON.generate` accepts
//! and what `JSON.parse` returns (string keys).

use crate::errors::{protocol_error, type_error};
use magnus::{
    prelude::*, r_hash::ForEach, Error, Float, Integer, IntoValue, RArray, RHash, RString, Ruby,
    Symbol, Value,
};
use pgbus_hub_core::protocol::{Object, ProtocolError};
use serde_json::{Map, Number, Value as Json};

/// A Ruby Hash as a JSON object. Keys: String and Symbol as-is, anything
/// else by `to_s` (as JSON.generate does).
pub fn hash_to_object(ruby: &Ruby, hash: RHash) -> Result<Object, Error> {
    let mut object = Map::with_capacity(hash.len());
    hash.foreach(|key: Value, value: Value| {
        let key = if let Some(s) = RString::from_value(key) {
            utf8(ruby, s)?
        } else if let Some(sym) = Symbol::from_value(key) {
            sym.name()?.into_owned()
        } else {
            key.funcall::<_, _, String>("to_s", ())?
        };
        object.insert(key, to_json(ruby, value)?);
        Ok(ForEach::Continue)
    })?;
    Ok(object)
}

fn to_json(ruby: &Ruby, value: Value) -> Result<Json, Error> {
    if value.is_nil() {
        return Ok(Json::Null);
    }
    if value.is_kind_of(ruby.class_true_class()) {
        return Ok(Json::Bool(true));
    }
    if value.is_kind_of(ruby.class_false_class()) {
        return Ok(Json::Bool(false));
    }
    if let Some(s) = RString::from_value(value) {
        return Ok(Json::String(utf8(ruby, s)?));
    }
    if let Some(sym) = Symbol::from_value(value) {
        return Ok(Json::String(sym.name()?.into_owned()));
    }
    if let Some(int) = Integer::from_value(value) {
        let number = int
            .to_i64()
            .map(Number::from)
            .or_else(|_| int.to_u64().map(Number::from));
        return number.map(Json::Number).map_err(|_| {
            Error::new(
                ruby.exception_range_error(),
                "integer does not fit in 64 bits for a hub frame",
            )
        });
    }
    if let Some(float) = Float::from_value(value) {
        return Number::from_f64(float.to_f64())
            .map(Json::Number)
            .ok_or_else(|| {
                protocol_error(
                    ruby,
                    ProtocolError::Malformed(format!("{} not allowed in JSON", value.inspect())),
                )
            });
    }
    if let Some(array) = RArray::from_value(value) {
        return array
            .into_iter()
            .map(|item| to_json(ruby, item))
            .collect::<Result<_, _>>()
            .map(Json::Array);
    }
    if let Some(hash) = RHash::from_value(value) {
        return hash_to_object(ruby, hash).map(Json::Object);
    }
    Err(type_error(
        ruby,
        format!("cannot put a {} in a hub frame", value.class().inspect()),
    ))
}

fn utf8(ruby: &Ruby, s: RString) -> Result<String, Error> {
    // SAFETY: the slice is copied before any other Ruby call can move or free the string.
    let bytes = unsafe { s.as_slice() }.to_vec();
    String::from_utf8(bytes).map_err(|_| {
        protocol_error(
            ruby,
            ProtocolError::Malformed("source sequence is illegal/malformed utf-8".into()),
        )
    })
}

/// A JSON object as a Ruby Hash with String keys.
pub fn object_to_hash(ruby: &Ruby, object: Object) -> Result<RHash, Error> {
    let hash = ruby.hash_new();
    for (key, value) in object {
        hash.aset(ruby.str_new(&key), to_ruby(ruby, value)?)?;
    }
    Ok(hash)
}

pub fn to_ruby(ruby: &Ruby, value: Json) -> Result<Value, Error> {
    Ok(match value {
        Json::Null => ruby.qnil().as_value(),
        Json::Bool(b) => b.into_value_with(ruby),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_value_with(ruby),
            (_, Some(u)) => u.into_value_with(ruby),
            _ => n.as_f64().unwrap_or(f64::NAN).into_value_with(ruby),
        },
        Json::String(s) => ruby.str_new(&s).as_value(),
        Json::Array(items) => {
            let array = ruby.ary_new_capa(items.len());
            for item in items {
                array.push(to_ruby(ruby, item)?)?;
            }
            array.as_value()
        }
        Json::Object(object) => object_to_hash(ruby, object)?.as_value(),
    })
}
