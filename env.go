package main

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// envText holds the text of each variable that was given a value, keyed by
// its name, exactly as it was set.
type envText map[string]string

// or is the text given for key, or fallback when none was.
func (e envText) or(key, fallback string) string {
	if text, ok := e[key]; ok {
		return text
	}
	return fallback
}

// textDecoder is a field type that reads its own variable, as RateLimit does.
type textDecoder interface{ Decode(string) error }

// errSwitch is what an on/off variable expects.
var errSwitch = errors.New("must be on or off (also true/false, 1/0)")

// readEnv sets each field of cfg from its variable (DNS_ and the envconfig
// tag) as lookup finds it; os.LookupEnv in production. One rule for all: a
// variable unset, empty or only spaces takes the default tag, and spaces
// around a value are ignored. Integers and durations must lie within their
// min and max tags. envconfig.Process is not used because it takes an empty
// value for a value and knows no ranges; the tags are still envconfig's,
// and envconfig prints them for -h.
func readEnv(cfg *Config, lookup func(string) (string, bool)) (envText, error) {
	given := envText{}
	v := reflect.ValueOf(cfg).Elem()
	for i := range v.NumField() {
		tags := v.Type().Field(i).Tag
		if tags.Get("envconfig") == "" {
			continue // no variable's: DNS_ alone names none (TestAttackBareDNSPrefixVariablePanics)
		}
		key := "DNS_" + tags.Get("envconfig")
		raw, _ := lookup(key)
		text := strings.TrimSpace(raw)
		if text != "" {
			given[key] = raw
		} else {
			raw = tags.Get("default")
			text = raw
		}
		if text == "" {
			continue // the zero value; the field's desc says what it means
		}
		if err := decodeField(v.Field(i), text, tags); err != nil {
			return nil, fmt.Errorf("%s=%q: %v", key, raw, err)
		}
	}
	return given, nil
}

// decodeField sets f from text, by f's type.
func decodeField(f reflect.Value, text string, tags reflect.StructTag) error {
	if d, ok := f.Addr().Interface().(textDecoder); ok {
		return d.Decode(text)
	}
	lo, hi := tags.Get("min"), tags.Get("max")
	switch f.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(strings.ToLower(text)) // units in any case
		if err != nil || d < mustDuration(lo) || d > mustDuration(hi) {
			return fmt.Errorf("must be a duration from %s to %s, such as 500ms or 2s", lo, hi)
		}
		f.SetInt(int64(d))
	case int:
		n, err := strconv.Atoi(text)
		if err != nil || n < mustInt(lo) || n > mustInt(hi) {
			return fmt.Errorf("must be an integer from %s to %s", lo, hi)
		}
		f.SetInt(int64(n))
	case bool:
		on, err := parseSwitch(text)
		if err != nil {
			return err
		}
		f.SetBool(on)
	case string:
		f.SetString(text)
	default:
		panic(fmt.Sprintf("config: no reader for a field of type %s", f.Type()))
	}
	return nil
}

// parseSwitch reads an on/off variable: on/off, true/false or 1/0, any case.
func parseSwitch(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "on", "true", "1":
		return true, nil
	case "off", "false", "0":
		return false, nil
	}
	return false, errSwitch
}

// mustInt and mustDuration read a range tag; a bad tag is a bug that every
// start-up would hit, so it panics.
func mustInt(tag string) int {
	n, err := strconv.Atoi(tag)
	if err != nil {
		panic(fmt.Sprintf("config: range tag %q: %v", tag, err))
	}
	return n
}

func mustDuration(tag string) time.Duration {
	d, err := time.ParseDuration(tag)
	if err != nil {
		panic(fmt.Sprintf("config: range tag %q: %v", tag, err))
	}
	return d
}
