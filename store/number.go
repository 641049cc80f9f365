package store

import (
	"encoding/json"
	"math"
	"strconv"
)

// asUint returns a NonTensor's data as a non-negative integer, whichever
// way it was decoded: a Go integer (in process), float64 (inline values,
// rpc), json.Number (a memmap prefix).
func asUint(data any) (uint64, bool) {
	switch v := data.(type) {
	case int:
		return uint64(v), v >= 0
	case int64:
		return uint64(v), v >= 0
	case uint64:
		return v, true
	case float64:
		// 1<<64 exactly: math.MaxUint64 as a float64 is 2^64, which
		// does not fit (its conversion is implementation-defined).
		if v >= 0 && v < 1<<64 && v == math.Trunc(v) {
			return uint64(v), true
		}
	case json.Number:
		u, err := strconv.ParseUint(string(v), 10, 64)
		return u, err == nil
	}
	return 0, false
}
