//! Where keys come from: generated (`user:0` .. `user:N-1`), a file of keys, or a traffic log.

use std::collections::HashMap;

/// A set of distinct keys, and optionally how many requests each received.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    keys: Vec<Vec<u8>>,
    requests: Option<Vec<u64>>,
}

impl KeySet {
    /// `count` keys from a template where `{}` is replaced by `0..count` (`user:{}` gives `user:0`
    /// .. `user:{count-1}`). A template without `{}` gets the number appended.
    pub fn generated(count: usize, template: &str) -> Self {
        let keys = (0..count)
            .map(|i| {
                if template.contains("{}") {
                    template.replace("{}", &i.to_string()).into_bytes()
                } else {
                    format!("{template}{i}").into_bytes()
                }
            })
            .collect();
        KeySet { keys, requests: None }
    }

    /// These keys, with how many requests each received (one count per key).
    pub fn with_requests(keys: Vec<Vec<u8>>, requests: Vec<u64>) -> Self {
        debug_assert_eq!(keys.len(), requests.len());
        KeySet { keys, requests: Some(requests) }
    }

    /// One key per non-empty line (a trailing `\r` is dropped); duplicates are kept once.
    pub fn from_lines(text: &[u8]) -> Self {
        let mut seen = std::collections::HashSet::new();
        let keys = lines(text).filter(|k| seen.insert(k.to_vec())).map(<[u8]>::to_vec).collect();
        KeySet { keys, requests: None }
    }

    /// A traffic log: one key per request, per line. The distinct keys, each with its request count.
    pub fn from_traffic(text: &[u8]) -> Self {
        let mut index: HashMap<&[u8], usize> = HashMap::new();
        let mut keys = Vec::new();
        let mut requests = Vec::new();
        for k in lines(text) {
            let i = *index.entry(k).or_insert_with(|| {
                keys.push(k.to_vec());
                requests.push(0);
                keys.len() - 1
            });
            requests[i] += 1;
        }
        KeySet { keys, requests: Some(requests) }
    }

    /// Attaches request counts from a traffic log to these keys (keys absent from the log get 0;
    /// requests for keys not in the set are added as new keys).
    pub fn with_traffic(mut self, text: &[u8]) -> Self {
        let mut index: HashMap<Vec<u8>, usize> = self.keys.iter().cloned().enumerate().map(|(i, k)| (k, i)).collect();
        let mut requests = vec![0u64; self.keys.len()];
        for k in lines(text) {
            let i = match index.get(k) {
                Some(&i) => i,
                None => {
                    self.keys.push(k.to_vec());
                    requests.push(0);
                    index.insert(k.to_vec(), self.keys.len() - 1);
                    self.keys.len() - 1
                }
            };
            requests[i] += 1;
        }
        self.requests = Some(requests);
        self
    }

    /// The keys.
    pub fn keys(&self) -> &[Vec<u8>] {
        &self.keys
    }

    /// Requests per key, if a traffic log was given.
    pub fn requests(&self) -> Option<&[u64]> {
        self.requests.as_deref()
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l)).filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_logs() {
        let k = KeySet::generated(3, "user:{}");
        assert_eq!(k.keys(), &[b"user:0".to_vec(), b"user:1".to_vec(), b"user:2".to_vec()]);
        let t = KeySet::from_traffic(b"a\nb\r\na\n\na\n");
        assert_eq!(t.keys(), &[b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(t.requests(), Some(&[3, 1][..]));
        let w = KeySet::generated(2, "k").with_traffic(b"k1\nk1\nz\n");
        assert_eq!(w.requests(), Some(&[0, 2, 1][..]));
        assert_eq!(KeySet::from_lines(b"x\nx\ny").len(), 2);
    }
}
