/* convmem_postings: one field of one doc into the search index's live posting lists, in C.
 *
 * Why: indexing is most of the daemon's CPU per imported event (bench/SPIKES.md, parts 17 and 19), and
 * what SearchIndex.add did per word and per distinct term in Python (a dict lookup a word, a Counter, a
 * posting append a distinct term: ~1 us each) was two thirds of it.  This does the same steps, in the
 * same order, on the same Python objects: the term of a word is still the tokenizer's (its cache's
 * lookup, and its own function on a miss), a new term still gets its id from SearchIndex._new_tid, and
 * the lists are the same None | int | array('I') / array('H') the rest of search.py reads.  What a word's
 * term is stays tokenize.py's: this only remembers its answers (the word cache below), and
 * tests/unit/test_native_postings.py checks that an index built through it is the pure-Python one, list
 * for list.
 *
 * Built as a top-level module (not storaged.convmem_postings) because the tests run from the source
 * tree, whose storaged/ package would hide an extension installed inside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *array_type;    /* array.array, imported by the module itself */
static PyObject *dl_bucket_fn;  /* search._dl_bucket: lengths from dl_exact on */
static PyObject *tf_bucket_fn;  /* search._tf_bucket: frequencies past tf_exact */
static PyObject *array_append;  /* array.array.append, called without a method lookup */
static long dl_exact = -1, tf_exact, dl_bits;

/* A doc field's terms and their frequencies, in first-seen order (what collections.Counter iterates),
 * keyed by the terms' values (exact strs: what counts as equal is str's own): two equal terms made by
 * different stemmer calls are one. */
typedef struct {
    PyObject *term;  /* a strong reference; an exact str */
    Py_hash_t hash;
    Py_ssize_t tf;
    Py_ssize_t tid;  /* post_counts' first pass: the term's id, its tf bucket (-1: tf 1) and key */
    long tq, key;
} Entry;

#define SMALL_ENTRIES 256

typedef struct {
    Py_ssize_t *index;  /* open addressing: entry number + 1, 0 empty */
    Py_ssize_t mask;
    Entry *entries;
    Py_ssize_t n, cap, total;
    Py_ssize_t small_index[SMALL_ENTRIES * 2];
    Entry small_entries[SMALL_ENTRIES];
} Counts;

static void counts_init(Counts *c) {
    c->index = c->small_index;
    c->mask = SMALL_ENTRIES * 2 - 1;
    memset(c->small_index, 0, sizeof(c->small_index));
    c->entries = c->small_entries;
    c->n = 0;
    c->cap = SMALL_ENTRIES;
    c->total = 0;
}

static void counts_free(Counts *c) {
    for (Py_ssize_t i = 0; i < c->n; i++)
        Py_DECREF(c->entries[i].term);
    if (c->index != c->small_index)
        PyMem_Free(c->index);
    if (c->entries != c->small_entries)
        PyMem_Free(c->entries);
}

static int counts_grow(Counts *c) {
    Py_ssize_t cap = c->cap * 2, slots = cap * 2;
    Entry *entries = PyMem_Malloc(cap * sizeof(Entry));
    Py_ssize_t *index = PyMem_Calloc(slots, sizeof(Py_ssize_t));
    if (entries == NULL || index == NULL) {
        PyMem_Free(entries);
        PyMem_Free(index);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(entries, c->entries, c->n * sizeof(Entry));
    if (c->entries != c->small_entries)
        PyMem_Free(c->entries);
    if (c->index != c->small_index)
        PyMem_Free(c->index);
    c->entries = entries;
    c->index = index;
    c->cap = cap;
    c->mask = slots - 1;
    for (Py_ssize_t e = 0; e < c->n; e++) {
        size_t i = (size_t)c->entries[e].hash & (size_t)c->mask;
        while (index[i])
            i = (i + 1) & (size_t)c->mask;
        index[i] = e + 1;
    }
    return 0;
}

/* One occurrence of a term (a str). */
static int counts_add(Counts *c, PyObject *term) {
    if (!PyUnicode_CheckExact(term)) {   /* a subclass's __hash__ or __eq__ could run any code */
        PyErr_Format(PyExc_TypeError, "a term must be a str, not %.100s", Py_TYPE(term)->tp_name);
        return -1;
    }
    Py_hash_t h = PyObject_Hash(term);
    if (h == -1)
        return -1;
    size_t i = (size_t)h & (size_t)c->mask;
    Py_ssize_t e;
    while ((e = c->index[i]) != 0) {
        Entry *en = &c->entries[e - 1];
        if (en->term == term) {
            en->tf++;
            c->total++;
            return 0;
        }
        if (en->hash == h) {
            int eq = PyUnicode_Compare(en->term, term);
            if (eq == -1 && PyErr_Occurred())
                return -1;
            if (eq == 0) {
                en->tf++;
                c->total++;
                return 0;
            }
        }
        i = (i + 1) & (size_t)c->mask;
    }
    if (c->n == c->cap) {
        if (counts_grow(c) < 0)
            return -1;
        i = (size_t)h & (size_t)c->mask;
        while (c->index[i])
            i = (i + 1) & (size_t)c->mask;
    }
    Py_INCREF(term);
    c->entries[c->n].term = term;
    c->entries[c->n].hash = h;
    c->entries[c->n].tf = 1;
    c->n++;
    c->index[i] = c->n;
    c->total++;
    return 0;
}

/* The words of a normalised ASCII text, as tokenize._ascii_words cuts them: the runs of word characters
 * ([a-z0-9]: word_class 1) and of single apostrophes (word_class 2) with a word character on each side;
 * anything else cuts.  word_class is tokenize's own table, given to configure(). */
static unsigned char word_class[128];

static inline int is_word_char(const unsigned char *s, Py_ssize_t i, Py_ssize_t n) {
    unsigned char k = word_class[s[i] & 0x7f];
    if (k == 1)
        return 1;
    return k == 2 && i > 0 && word_class[s[i - 1] & 0x7f] == 1 && i + 1 < n && word_class[s[i + 1] & 0x7f] == 1;
}

/* The next word of s[*i:n]: its start, and *i past it; -1 when none is left.  Counts its letters and
 * digits (a word of only one kind is str.isalpha() or str.isdigit()). */
static Py_ssize_t next_word(const unsigned char *s, Py_ssize_t n, Py_ssize_t *i, Py_ssize_t *letters,
                            Py_ssize_t *digits) {
    Py_ssize_t k = *i;
    while (k < n && !is_word_char(s, k, n))
        k++;
    Py_ssize_t start = k;
    *letters = *digits = 0;
    for (; k < n && is_word_char(s, k, n); k++) {
        *letters += s[k] >= 'a' && s[k] <= 'z';
        *digits += s[k] >= '0' && s[k] <= '9';
    }
    *i = k;
    return k == start ? -1 : start;
}

/* A word's term, cached by the word's bytes: the tokenizer's cache needs a str made for every word and
 * a lookup in a big dict (two or three cache misses); this makes no object for a word it has seen.  A
 * miss asks the tokenizer's cache (a dict whose __missing__ computes the term: the definition) and keeps
 * its answer — only for that cache (word_terms, given to configure()): a post() with another mapping
 * neither reads nor fills it.  Hashed with CPython's string hash, keyed at random per process unless
 * PYTHONHASHSEED fixes it (then, as for any dict, words can be made to collide); bounded by emptying it
 * when full, as the tokenizer's own cache is.  No pointer into it is held across a call into Python
 * (which may run another thread's post()). */
typedef struct {
    Py_hash_t hash;
    PyObject *word;  /* its bytes (a str), NULL: an empty slot */
    PyObject *term;  /* the word's term, or None */
} WordEntry;

#define WORD_CACHE_LONGEST 64  /* longer words (paths, blobs) are looked up, not kept */
static WordEntry *word_cache;
static PyObject *word_terms;   /* the tokenizer's cache: the only mapping whose answers are kept */
static size_t word_mask, word_count, word_max;

static void word_cache_clear(void) {
    if (word_cache == NULL)
        return;
    for (size_t i = 0; i <= word_mask; i++) {
        Py_CLEAR(word_cache[i].word);
        Py_CLEAR(word_cache[i].term);
    }
    word_count = 0;
}

static Py_hash_t hash_bytes(const unsigned char *b, Py_ssize_t len) {
#if PY_VERSION_HEX >= 0x030E0000
    return Py_HashBuffer(b, len);
#else
    return PyHash_GetFuncDef()->hash(b, len);   /* what hashes a str's bytes */
#endif
}

/* The term of a word: the tokenizer's cache (a dict whose __missing__ computes and keeps it).  A new
 * reference, Py_None for a word that indexes nothing, NULL on an error. */
static PyObject *term_of_word(PyObject *terms, PyObject *word) {
    PyObject *t = PyDict_GetItemWithError(terms, word);
    if (t != NULL) {
        Py_INCREF(t);
        return t;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_GetItem(terms, word);
}

/* The term of the word b[:len] (a new reference: a str, or None), NULL on an error. */
static PyObject *word_term(PyObject *terms, const unsigned char *b, Py_ssize_t len) {
    Py_hash_t h = 0;
    int cached = len <= WORD_CACHE_LONGEST && terms == word_terms;
    if (cached) {
        h = hash_bytes(b, len);
        for (size_t i = (size_t)h & word_mask; word_cache[i].word != NULL; i = (i + 1) & word_mask) {
            WordEntry *e = &word_cache[i];
            if (e->hash == h && PyUnicode_GET_LENGTH(e->word) == len
                && memcmp(PyUnicode_1BYTE_DATA(e->word), b, len) == 0) {
                Py_INCREF(e->term);
                return e->term;
            }
        }
    }
    PyObject *w = PyUnicode_DecodeASCII((const char *)b, len, NULL);
    if (w == NULL)
        return NULL;
    PyObject *t = term_of_word(terms, w);
    if (t == NULL || !cached || terms != word_terms) {   /* configure() may have run meanwhile */
        Py_DECREF(w);
        return t;
    }
    if (word_count >= word_max)
        word_cache_clear();
    size_t i = (size_t)h & word_mask;
    while (word_cache[i].word != NULL) {   /* probed again: Python code ran since */
        if (word_cache[i].hash == h && PyUnicode_Compare(word_cache[i].word, w) == 0) {
            Py_DECREF(w);   /* another thread kept it meanwhile */
            return t;
        }
        i = (i + 1) & word_mask;
    }
    word_cache[i].hash = h;
    word_cache[i].word = w;   /* the reference made above */
    Py_INCREF(t);
    word_cache[i].term = t;
    word_count++;
    return t;
}

/* index_terms of a normalised ASCII text (tokenize.posting_items): each word's term, then the parts of
 * the words mixing letters with digits or apostrophes, when the text holds a digit — index_terms appends
 * them after the words' terms, so new terms get their ids in the same order. */
static int count_text(Counts *c, PyObject *text, PyObject *terms, PyObject *alnum_parts) {
    const unsigned char *s = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int any_digit = 0, any_mixed = 0;
    Py_ssize_t i = 0, start, letters, digits;
    while ((start = next_word(s, n, &i, &letters, &digits)) >= 0) {
        any_digit |= digits > 0;
        any_mixed |= letters != i - start && digits != i - start;
        PyObject *t = word_term(terms, s + start, i - start);
        if (t == NULL)
            return -1;
        int r = t == Py_None ? 0 : PyObject_IsTrue(t);   /* filter(None, ...): None, and an empty term */
        if (r > 0)
            r = counts_add(c, t);
        Py_DECREF(t);
        if (r < 0)
            return -1;
    }
    if (!any_digit || !any_mixed)
        return 0;
    i = 0;
    while ((start = next_word(s, n, &i, &letters, &digits)) >= 0) {
        if (letters == i - start || digits == i - start)
            continue;   /* str.isalpha() or str.isdigit(): no parts */
        PyObject *w = PyUnicode_DecodeASCII((const char *)s + start, i - start, NULL);
        if (w == NULL)
            return -1;
        PyObject *parts = PyObject_CallOneArg(alnum_parts, w);
        Py_DECREF(w);
        if (parts == NULL)
            return -1;
        PyObject *seq = PySequence_Fast(parts, "alnum parts must be a sequence");
        Py_DECREF(parts);
        if (seq == NULL)
            return -1;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
            if (counts_add(c, PySequence_Fast_GET_ITEM(seq, j)) < 0) {
                Py_DECREF(seq);
                return -1;
            }
        }
        Py_DECREF(seq);
    }
    return 0;
}

static long bucket(PyObject *fn, Py_ssize_t v) {
    PyObject *r = PyObject_CallFunction(fn, "n", v);
    if (r == NULL)
        return -1;
    long q = PyLong_AsLong(r);
    Py_DECREF(r);
    if (q < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "a bucket must not be negative, not %ld", q);
    return q < 0 ? -1 : q;
}

static PyObject *make_array(const char *code, PyObject *a, PyObject *b) {
    PyObject *items = PyTuple_Pack(2, a, b);
    if (items == NULL)
        return NULL;
    PyObject *r = PyObject_CallFunction(array_type, "sO", code, items);
    Py_DECREF(items);
    return r;
}

static int append(PyObject *arr, PyObject *v) {
    PyObject *args[2] = {arr, v};
    PyObject *r = PyObject_Vectorcall(array_append, args, 2, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The postings of one field's counted terms; see SearchIndex.add.  In two passes: first every call into
 * Python (a new term's id, the length and frequency buckets), then the lists changed with none in between,
 * each term id checked against them as it is used — so no Python code (another thread's, a callback's)
 * runs between a bounds check and the write it guards, and a callback that fails changes no list. */
static int post_counts(Counts *c, PyObject *vocab, PyObject *new_tid, PyObject *slots_f, PyObject *keys_f,
                       PyObject *maxtf_f, Py_ssize_t slot, Py_ssize_t out[5]) {
    Py_ssize_t n = c->total, single = 0, arrays = 0, posted = 0;
    long max_tq = 0;
    long dlq = n < dl_exact ? (long)n : bucket(dl_bucket_fn, n);
    if (dlq < 0)
        return -1;
    if (dlq >= (1L << dl_bits)) {
        PyErr_Format(PyExc_ValueError, "length bucket %ld past %ld bits", dlq, dl_bits);
        return -1;
    }
    for (Py_ssize_t e = 0; e < c->n; e++) {
        Entry *en = &c->entries[e];
        PyObject *tid_obj = PyDict_GetItemWithError(vocab, en->term);
        if (tid_obj != NULL)
            Py_INCREF(tid_obj);
        else if (PyErr_Occurred() || (tid_obj = PyObject_CallOneArg(new_tid, en->term)) == NULL)
            return -1;
        en->tid = PyLong_AsSsize_t(tid_obj);
        Py_DECREF(tid_obj);
        if (en->tid == -1 && PyErr_Occurred())
            return -1;
        en->tq = -1;   /* tf 1: the key is the length bucket alone */
        en->key = dlq;
        if (en->tf != 1) {
            long tq = en->tf <= tf_exact ? (long)en->tf - 1 : bucket(tf_bucket_fn, en->tf);
            if (tq < 0)
                return -1;
            if (tq > 255 || (tq << dl_bits) > 0xffff) {
                PyErr_Format(PyExc_ValueError, "tf bucket %ld does not fit a key", tq);
                return -1;
            }
            en->tq = tq;
            en->key = (tq << dl_bits) | dlq;
        }
    }
    PyObject *slot_obj = PyLong_FromSsize_t(slot);
    if (slot_obj == NULL)
        return -1;
    int rc = -1;
    for (Py_ssize_t e = 0; e < c->n; e++) {
        Entry *en = &c->entries[e];
        Py_ssize_t tid = en->tid;
        if (tid < 0 || tid >= PyList_GET_SIZE(slots_f) || tid >= PyList_GET_SIZE(keys_f)
            || tid >= PyByteArray_GET_SIZE(maxtf_f)) {
            PyErr_Format(PyExc_IndexError, "term id %zd has no list", tid);
            goto done;
        }
        unsigned char *mt = (unsigned char *)PyByteArray_AS_STRING(maxtf_f);
        if (en->tq > mt[tid]) {
            mt[tid] = (unsigned char)en->tq;
            if (en->tq > max_tq)
                max_tq = en->tq;
        }
        PyObject *p = PyList_GET_ITEM(slots_f, tid);
        if (p == Py_None) {
            PyObject *key_obj = PyLong_FromLong(en->key);
            if (key_obj == NULL)
                goto done;
            Py_INCREF(slot_obj);
            PyList_SetItem(slots_f, tid, slot_obj);   /* steals; the None it replaces runs no code */
            PyList_SetItem(keys_f, tid, key_obj);
            single++;
        } else if (PyLong_CheckExact(p)) {
            PyObject *key_obj = PyLong_FromLong(en->key);
            if (key_obj == NULL)
                goto done;
            PyObject *s = make_array("I", p, slot_obj);
            PyObject *k = s == NULL ? NULL : make_array("H", PyList_GET_ITEM(keys_f, tid), key_obj);
            Py_DECREF(key_obj);
            if (k == NULL) {
                Py_XDECREF(s);
                goto done;
            }
            PyList_SetItem(slots_f, tid, s);   /* the ints they replace run no code */
            PyList_SetItem(keys_f, tid, k);
            single--;
            arrays += 2;
            posted += 2;
        } else {
            PyObject *key_obj = PyLong_FromLong(en->key);
            if (key_obj == NULL)
                goto done;
            int r = append(p, slot_obj);
            if (r == 0)
                r = append(PyList_GET_ITEM(keys_f, tid), key_obj);
            Py_DECREF(key_obj);
            if (r < 0)
                goto done;
            posted++;
        }
    }
    out[0] = n;
    out[1] = single;
    out[2] = arrays;
    out[3] = posted;
    out[4] = max_tq;
    rc = 0;
done:
    Py_DECREF(slot_obj);
    return rc;
}

PyDoc_STRVAR(post_doc,
"post(items, terms, alnum_parts, vocab, new_tid, slots_f, keys_f, maxtf_f, slot)\n"
"-> (n, single, arrays, posted, max_tq)\n\n"
"One field of one doc into a field's live lists.  items: a normalised ASCII text (terms: the\n"
"tokenizer's word -> term cache, alnum_parts: its parts of a word mixing letters and digits), or a list\n"
"of terms (terms None).  n is the field's length in terms (0: nothing posted); single, arrays and\n"
"posted are what the index's counters gain; max_tq the highest tf bucket that raised a term's maxtf.");

static PyObject *post(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "post() takes 9 arguments");
        return NULL;
    }
    if (dl_exact < 0) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    PyObject *items = args[0], *terms = args[1], *alnum_parts = args[2], *vocab = args[3];
    PyObject *new_tid = args[4], *slots_f = args[5], *keys_f = args[6], *maxtf_f = args[7];
    int words = terms != Py_None;
    if (!(words ? PyUnicode_Check(items) && PyUnicode_IS_ASCII(items) && PyDict_Check(terms) : PyList_Check(items))
        || !PyDict_Check(vocab) || !PyList_Check(slots_f) || !PyList_Check(keys_f) || !PyByteArray_Check(maxtf_f)) {
        PyErr_SetString(PyExc_TypeError, "post(): an ASCII str and a dict, or a list and None; then callable, "
                                         "dict, callable, list, list, bytearray, int");
        return NULL;
    }
    Py_ssize_t slot = PyLong_AsSsize_t(args[8]);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    Counts c;
    counts_init(&c);
    Py_ssize_t out[5] = {0, 0, 0, 0, 0};
    int r;
    if (!words) {
        r = 0;
        for (Py_ssize_t k = 0; r == 0 && k < PyList_GET_SIZE(items); k++)
            r = counts_add(&c, PyList_GET_ITEM(items, k));
    } else {
        r = count_text(&c, items, terms, alnum_parts);
    }
    if (r == 0 && c.total)
        r = post_counts(&c, vocab, new_tid, slots_f, keys_f, maxtf_f, slot, out);
    counts_free(&c);
    if (r < 0)
        return NULL;
    return Py_BuildValue("(nnnnn)", out[0], out[1], out[2], out[3], out[4]);
}

PyDoc_STRVAR(words_doc,
"words(text) -> list[str]\n\n"
"The words post() cuts a normalised ASCII text into (tokenize._ascii_words's, by its test).");

static PyObject *words(PyObject *self, PyObject *text) {
    if (dl_exact < 0) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyUnicode_Check(text) || !PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_TypeError, "words(): an ASCII str expected");
        return NULL;
    }
    const unsigned char *s = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0, start, letters, digits;
    PyObject *out = PyList_New(0);
    while (out != NULL && (start = next_word(s, n, &i, &letters, &digits)) >= 0) {
        PyObject *w = PyUnicode_DecodeASCII((const char *)s + start, i - start, NULL);
        if (w == NULL || PyList_Append(out, w) < 0)
            Py_CLEAR(out);
        Py_XDECREF(w);
    }
    return out;
}

PyDoc_STRVAR(configure_doc,
"configure(dl_exact, tf_exact, dl_bits, dl_bucket, tf_bucket, word_class, word_terms, word_cache_max)\n\n"
"The key layout of search.py; the tokenizer's word characters (a byte per ASCII character: 1 a word\n"
"character, 2 the apostrophe, 0 a cut), its word -> term cache and the word cache's bound: given at\n"
"search.py's import (defined there and in tokenize.py, not here).  Called again, it empties the word\n"
"cache; refused, it changes nothing.");

static PyObject *configure(PyObject *self, PyObject *args) {
    long de, te, db;
    PyObject *dlb, *tfb, *wt;
    Py_buffer wc;
    Py_ssize_t wmax;
    if (!PyArg_ParseTuple(args, "lllOOy*On", &de, &te, &db, &dlb, &tfb, &wc, &wt, &wmax))
        return NULL;
    int bad = de < 1 || te < 1 || db < 1 || db > 15 || !PyCallable_Check(dlb) || !PyCallable_Check(tfb)
              || wc.len != 128 || !PyDict_Check(wt) || wmax < 1 || wmax > (1 << 24);
    unsigned char classes[128];
    if (!bad)
        memcpy(classes, wc.buf, 128);
    PyBuffer_Release(&wc);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "configure(): bad key layout, word classes, term cache or bound");
        return NULL;
    }
    size_t slots = 1;
    while (slots < (size_t)wmax * 2)
        slots <<= 1;
    WordEntry *cache = PyMem_Calloc(slots, sizeof(WordEntry));
    if (cache == NULL)
        return PyErr_NoMemory();
    word_cache_clear();   /* from here on nothing fails */
    PyMem_Free(word_cache);
    word_cache = cache;
    word_mask = slots - 1;
    word_max = (size_t)wmax;
    memcpy(word_class, classes, 128);
    Py_INCREF(dlb);
    Py_INCREF(tfb);
    Py_INCREF(wt);
    Py_XSETREF(dl_bucket_fn, dlb);
    Py_XSETREF(tf_bucket_fn, tfb);
    Py_XSETREF(word_terms, wt);
    dl_exact = de;
    tf_exact = te;
    dl_bits = db;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"post", (PyCFunction)(void (*)(void))post, METH_FASTCALL, post_doc},
    {"words", words, METH_O, words_doc},
    {"configure", configure, METH_VARARGS, configure_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "convmem_postings",
    "The search index's posting appends in C (storaged/postings.c).", -1, methods,
};

PyMODINIT_FUNC PyInit_convmem_postings(void) {
    PyObject *mod = PyImport_ImportModule("array");
    if (mod == NULL)
        return NULL;
    array_type = PyObject_GetAttrString(mod, "array");
    Py_DECREF(mod);
    if (array_type == NULL)
        return NULL;
    array_append = PyObject_GetAttrString(array_type, "append");
    if (array_append == NULL)
        return NULL;
    return PyModule_Create(&module);
}
