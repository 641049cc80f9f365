package npy

import (
	"fmt"
	"math"
)

// kind is the type of a Python literal.
type kind uint8

const (
	kindStr kind = iota + 1
	kindInt
	kindBool
	kindTuple
	kindList
	kindDict
)

// A literal is a parsed Python literal: the subset of Python's literal
// syntax that .npy headers use.
type literal struct {
	kind  kind
	str   string    // kindStr: the characters between the quotes, undecoded
	num   int       // kindInt
	bool  bool      // kindBool
	elems []literal // kindTuple, kindList; kindDict: keys and values, alternating
	src   string    // the literal's source text
}

// maxDepth bounds the nesting of tuples, lists and dicts, so that hostile
// input cannot exhaust the stack. Real headers nest at most a few levels.
const maxDepth = 32

// parseLiteral parses s, which must hold exactly one literal surrounded by
// optional whitespace. It accepts:
//
//   - strings in single or double quotes, optionally prefixed by u
//     (Python 2); a backslash escapes the next character, which is kept
//     undecoded;
//   - non-negative decimal integers without leading zeros, optionally
//     suffixed by L (Python 2 longs), that fit in an int;
//   - True and False;
//   - tuples, lists and dicts of literals, with an optional trailing comma;
//     a parenthesized literal without a comma is that literal, not a tuple.
//
// Anything else, such as None, floats, negative numbers or expressions, is
// an error.
func parseLiteral(s string) (literal, error) {
	p := parser{s: s}
	v, err := p.literal(0)
	if err != nil {
		return literal{}, err
	}
	p.space()
	if p.pos < len(p.s) {
		return literal{}, p.errorf("unexpected %q after the literal", p.s[p.pos])
	}
	return v, nil
}

// parser is the state of parseLiteral: the text and the read position.
type parser struct {
	s   string
	pos int
}

// errorf returns an ErrFormat error at the current position.
func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: header at byte %d: %s", ErrFormat, p.pos, fmt.Sprintf(format, args...))
}

// space skips whitespace.
func (p *parser) space() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t' || p.s[p.pos] == '\n' || p.s[p.pos] == '\r') {
		p.pos++
	}
}

// literal parses a literal nested in depth tuples, lists or dicts.
func (p *parser) literal(depth int) (literal, error) {
	p.space()
	if p.pos == len(p.s) {
		return literal{}, p.errorf("unexpected end")
	}
	start := p.pos
	var v literal
	var err error
	switch c := p.s[p.pos]; {
	case c == '\'' || c == '"':
		v, err = p.str()
	case c == 'u' && p.pos+1 < len(p.s) && (p.s[p.pos+1] == '\'' || p.s[p.pos+1] == '"'):
		p.pos++
		v, err = p.str()
	case '0' <= c && c <= '9':
		v, err = p.int()
	case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		v, err = p.name()
	case c == '(' || c == '[' || c == '{':
		if depth == maxDepth {
			return literal{}, p.errorf("nested deeper than %d levels", maxDepth)
		}
		v, err = p.seq(depth)
	default:
		return literal{}, p.errorf("unexpected %q", c)
	}
	if err != nil {
		return literal{}, err
	}
	if v.src == "" {
		v.src = p.s[start:p.pos]
	}
	return v, nil
}

// str parses a string starting at its opening quote.
func (p *parser) str() (literal, error) {
	quote := p.s[p.pos]
	for i := p.pos + 1; i < len(p.s); i++ {
		switch p.s[i] {
		case quote:
			v := literal{kind: kindStr, str: p.s[p.pos+1 : i]}
			p.pos = i + 1
			return v, nil
		case '\\':
			i++
		case '\n':
			i = len(p.s)
		}
	}
	return literal{}, p.errorf("unterminated string")
}

// int parses a non-negative integer.
func (p *parser) int() (literal, error) {
	n := 0
	start := p.pos
	for ; p.pos < len(p.s) && '0' <= p.s[p.pos] && p.s[p.pos] <= '9'; p.pos++ {
		d := int(p.s[p.pos] - '0')
		if n > (math.MaxInt-d)/10 {
			return literal{}, p.errorf("integer too large")
		}
		n = n*10 + d
	}
	if p.s[start] == '0' && p.pos-start > 1 {
		return literal{}, p.errorf("integer %s has a leading zero", p.s[start:p.pos])
	}
	if p.pos < len(p.s) && (p.s[p.pos] == 'L' || p.s[p.pos] == 'l') {
		p.pos++
	}
	return literal{kind: kindInt, num: n}, nil
}

// name parses True or False; any other name is an error.
func (p *parser) name() (literal, error) {
	end := p.pos
	for end < len(p.s) && isIdent(p.s[end]) {
		end++
	}
	switch name := p.s[p.pos:end]; name {
	case "True", "False":
		p.pos = end
		return literal{kind: kindBool, bool: name == "True"}, nil
	default:
		return literal{}, p.errorf("unexpected name %q", name)
	}
}

func isIdent(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// seq parses a tuple, list or dict starting at its opening bracket. The
// contents are nested one level deeper than depth.
func (p *parser) seq(depth int) (literal, error) {
	var end byte
	var k kind
	switch p.s[p.pos] {
	case '(':
		end, k = ')', kindTuple
	case '[':
		end, k = ']', kindList
	default:
		end, k = '}', kindDict
	}
	p.pos++
	v := literal{kind: k}
	comma := false
	for {
		p.space()
		if p.pos < len(p.s) && p.s[p.pos] == end {
			p.pos++
			break
		}
		if p.pos == len(p.s) {
			return literal{}, p.errorf("unexpected end")
		}
		if len(v.elems) > 0 && !comma {
			return literal{}, p.errorf("missing ',' or %q", end)
		}
		e, err := p.literal(depth + 1)
		if err != nil {
			return literal{}, err
		}
		v.elems = append(v.elems, e)
		if k == kindDict {
			p.space()
			if p.pos == len(p.s) || p.s[p.pos] != ':' {
				return literal{}, p.errorf("missing ':' after dict key")
			}
			p.pos++
			if e, err = p.literal(depth + 1); err != nil {
				return literal{}, err
			}
			v.elems = append(v.elems, e)
		}
		p.space()
		comma = p.pos < len(p.s) && p.s[p.pos] == ','
		if comma {
			p.pos++
		}
	}
	if k == kindTuple && len(v.elems) == 1 && !comma {
		return v.elems[0], nil // (x) is x
	}
	return v, nil
}
