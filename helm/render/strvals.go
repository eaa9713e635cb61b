package main

// --set parsing (helm.sh/helm/v3/pkg/strvals, the common subset).

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// typedVal is strvals.typedVal.
func typedVal(val string, st bool) interface{} {
	if st {
		return val
	}
	if strings.EqualFold(val, "true") {
		return true
	}
	if strings.EqualFold(val, "false") {
		return false
	}
	if strings.EqualFold(val, "null") {
		return nil
	}
	if strings.EqualFold(val, "0") {
		return int64(0)
	}
	if len(val) != 0 && val[0] != '0' {
		if iv, err := strconv.ParseInt(val, 10, 64); err == nil {
			return iv
		}
	}
	return val
}

// splitUnescaped splits s at sep outside {...}, keeping backslash escapes.
func splitUnescaped(s string, sep rune) []string {
	var parts []string
	var cur strings.Builder
	depth := 0
	esc := false
	for _, r := range s {
		switch {
		case esc:
			cur.WriteRune('\\')
			cur.WriteRune(r)
			esc = false
		case r == '\\':
			esc = true
		case r == '{':
			depth++
			cur.WriteRune(r)
		case r == '}':
			depth--
			cur.WriteRune(r)
		case r == sep && depth == 0:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	if esc {
		cur.WriteRune('\\')
	}
	parts = append(parts, cur.String())
	return parts
}

func unescape(s string) string {
	var b strings.Builder
	esc := false
	for _, r := range s {
		if esc {
			b.WriteRune(r)
			esc = false
			continue
		}
		if r == '\\' {
			esc = true
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

var indexRe = regexp.MustCompile(`^(.*?)\[(\d+)\]$`)

// parseSet applies "a.b=c,d[0]=e,f={x,y}" to vals.
func parseSet(s string, vals map[string]interface{}, st bool) error {
	for _, pair := range splitUnescaped(s, ',') {
		if pair == "" {
			continue
		}
		kv := splitUnescaped(pair, '=')
		if len(kv) < 2 {
			return fmt.Errorf("key %q has no value", unescape(pair))
		}
		key := kv[0]
		raw := strings.Join(kv[1:], "=")
		var val interface{}
		if !st && strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			list := []interface{}{}
			inner := raw[1 : len(raw)-1]
			if inner != "" {
				for _, item := range splitUnescaped(inner, ',') {
					list = append(list, typedVal(unescape(item), false))
				}
			}
			val = list
		} else {
			val = typedVal(unescape(raw), st)
		}
		segs := splitUnescaped(key, '.')
		if err := setPath(vals, segs, val); err != nil {
			return fmt.Errorf("%s: %w", unescape(key), err)
		}
	}
	return nil
}

func setPath(m map[string]interface{}, segs []string, val interface{}) error {
	seg := segs[0]
	idx := -1
	name := seg
	if mm := indexRe.FindStringSubmatch(seg); mm != nil {
		name = mm[1]
		i, err := strconv.Atoi(mm[2])
		if err != nil || i > 65536 {
			return fmt.Errorf("bad list index in %q", seg)
		}
		idx = i
	}
	name = unescape(name)
	if name == "" {
		return errors.New("empty key")
	}
	last := len(segs) == 1
	if idx < 0 {
		if last {
			m[name] = val
			return nil
		}
		child, ok := m[name].(map[string]interface{})
		if !ok {
			child = map[string]interface{}{}
			m[name] = child
		}
		return setPath(child, segs[1:], val)
	}
	list, _ := m[name].([]interface{})
	for len(list) <= idx {
		list = append(list, nil)
	}
	if last {
		list[idx] = val
	} else {
		child, ok := list[idx].(map[string]interface{})
		if !ok {
			child = map[string]interface{}{}
			list[idx] = child
		}
		if err := setPath(child, segs[1:], val); err != nil {
			return err
		}
	}
	m[name] = list
	return nil
}
