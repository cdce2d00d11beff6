package triplane

//go:generate go run ./internal/opgen/cmd ../../proto/ops.json ops_gen.go
