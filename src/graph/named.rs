//! [`Named`]: values in the order they were named, found by name in constant time.
//!
//! A graph's inputs and outputs are named by the user, and a program may name thousands (every
//! layer's activations, say) and look each one up after every replay; a list searched by name
//! made naming and lookups quadratic in their count.

use std::collections::HashMap;

/// Values in naming order, with an index by name; names are unique.
#[derive(Debug, Clone)]
pub(crate) struct Named<T> {
    list: Vec<(String, T)>,
    index: HashMap<String, usize>,
}

impl<T> Default for Named<T> {
    fn default() -> Self {
        Named {
            list: Vec::new(),
            index: HashMap::new(),
        }
    }
}

impl<T> Named<T> {
    /// Adds `value` as `name`; `false` (and nothing added) when the name is taken.
    pub fn insert(&mut self, name: &str, value: T) -> bool {
        if self.index.contains_key(name) {
            return false;
        }
        self.index.insert(name.to_string(), self.list.len());
        self.list.push((name.to_string(), value));
        true
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.index.get(name).map(|&i| &self.list[i].1)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The names and values in naming order.
    pub fn list(&self) -> &[(String, T)] {
        &self.list
    }
}

impl<T> FromIterator<(String, T)> for Named<T> {
    /// Later duplicates of a name are dropped (callers build from unique names).
    fn from_iter<I: IntoIterator<Item = (String, T)>>(iter: I) -> Self {
        let mut named = Named::default();
        for (name, value) in iter {
            named.insert(&name, value);
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_refuses_a_taken_name() {
        let mut n = Named::default();
        assert!(n.insert("b", 1));
        assert!(n.insert("a", 2));
        assert!(!n.insert("b", 3));
        assert_eq!(n.get("b"), Some(&1));
        assert_eq!(n.get("c"), None);
        let names: Vec<&str> = n.list().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
    }
}
